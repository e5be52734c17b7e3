"""The schema: one SQLAlchemy Core table per entity of DESIGN.md, portable to SQLite and PostgreSQL.

Resource amounts are stored as integers in milli-units (1 cpu = 1000, 1 byte of memory = 1000):
exact arithmetic on both backends, CHECK constraints the database can enforce, and int64 arrays
for the scheduler.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from corral.domain.outcome import DEFAULT_DEPENDENCY_KIND, DependencyKind
from corral.domain.status import EndpointLifecycle, KernelStatus, RouteStatus, SessionStatus

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class _SQLiteTimestamp(sqlite.DATETIME):
    """SQLite's DATETIME, written as usual but read back as its raw text (parsed below)."""

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> None:
        return None


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on both backends (SQLite keeps no zone of its own).

    On SQLite the stored text is parsed with `datetime.fromisoformat` (C) rather than
    SQLAlchemy's regular expression: loading ten thousand sessions parses tens of thousands.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(_SQLiteTimestamp())  # type: ignore[no-untyped-call]
        return dialect.type_descriptor(sa.DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps written to the store must be timezone-aware")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(
        self, value: datetime | str | None, dialect: sa.Dialect
    ) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Python None is SQL NULL (not the JSON literal null), so `IS NULL` means "no value".
JSONType: sa.types.TypeEngine[Any] = sa.JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql"
)
BigID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATUS_LEN = 16
# The predicate of `ix_sessions_retry_undecided`: queries repeat it word for word, so that both
# backends' planners see the partial index applies.
RETRY_UNDECIDED = "max_retries > 0 AND retry_decision IS NULL"
NAME_LEN = 64


# A status column allows only its enum's values. On SQLite a CHECK on the table says so. On
# PostgreSQL the column's type is a domain with that CHECK (migration 0013): PostgreSQL parses a
# table's CHECK from its stored text at every execution of an INSERT or UPDATE, 10 µs a row for
# eleven statuses, where a domain's is parsed once per connection.
def _status(name: str, domain: str, values: Any) -> tuple[sa.Column[str], sa.CheckConstraint]:
    """A NOT NULL status column `name` allowing only the `values` of an enum, and the table's
    CHECK that says so on SQLite (spread into the table's arguments: `*_status(...)`)."""

    def allowed(subject: str) -> str:
        listed = ", ".join(f"'{v.value}'" for v in values)
        return f"{subject} IN ({listed})"

    on_postgresql = postgresql.DOMAIN(domain, sa.String(STATUS_LEN), check=allowed("VALUE"))
    column = sa.Column(
        name, sa.String(STATUS_LEN).with_variant(on_postgresql, "postgresql"), nullable=False
    )
    check = sa.CheckConstraint(allowed(name), name=f"{name}_valid").ddl_if(dialect="sqlite")
    return column, check


def _created() -> sa.Column[datetime]:
    return sa.Column("created_at", UTCDateTime(), nullable=False)


users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.String(NAME_LEN), nullable=False, unique=True),
    sa.Column("role", sa.String(STATUS_LEN), nullable=False),
    _created(),
    sa.CheckConstraint("role IN ('admin', 'user')", name="role_valid"),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("user_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("name", sa.String(NAME_LEN), nullable=False),
    # SHA-256 hex of the secret; the secret itself is never stored.
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    _created(),
    sa.Column("expires_at", UTCDateTime(), nullable=True),
    sa.Column("last_used_at", UTCDateTime(), nullable=True),
    sa.Index(None, "user_id"),
)

# Signed-in dashboards (migration 0030): the cookie holds a random secret, stored here hashed,
# bound to the user and the API token that signed in; revoking the token or removing the user
# ends them (the cascades), as does signing out or `expires_at`.
dashboard_sessions = sa.Table(
    "dashboard_sessions",
    metadata,
    sa.Column("secret_hash", sa.String(64), primary_key=True),  # SHA-256 hex of the cookie's
    sa.Column("user_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column(
        "token_id", sa.Uuid(), sa.ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=False
    ),
    _created(),
    sa.Column("expires_at", UTCDateTime(), nullable=False),
    sa.Index(None, "user_id"),
    sa.Index(None, "token_id"),
    sa.Index(None, "expires_at"),
)

resource_groups = sa.Table(
    "resource_groups",
    metadata,
    sa.Column("name", sa.String(NAME_LEN), primary_key=True),
    sa.Column("description", sa.String(256), nullable=False, server_default=""),
    # Scheduling and admission options (sequencer, selector, ordering, limits); see domain.
    sa.Column("options", JSONType, nullable=False),
    _created(),
)

agents = sa.Table(
    "agents",
    metadata,
    sa.Column("id", sa.String(NAME_LEN), primary_key=True),
    sa.Column("address", sa.String(256), nullable=False),
    sa.Column(
        "resource_group",
        sa.String(NAME_LEN),
        sa.ForeignKey("resource_groups.name"),
        nullable=False,
    ),
    sa.Column("status", sa.String(STATUS_LEN), nullable=False),
    sa.Column("schedulable", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column("runtime", sa.String(32), nullable=False),
    sa.Column("labels", JSONType, nullable=False),
    sa.Column("last_heartbeat_at", UTCDateTime(), nullable=True),
    # Bumped whenever the agent's desired kernels change; agents long-poll on it.
    sa.Column("assignment_revision", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("token_hash", sa.String(64), nullable=True),
    _created(),
    sa.Column("status_changed_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint("status IN ('ALIVE', 'LOST', 'TERMINATED')", name="status_valid"),
    sa.Index(None, "resource_group", "status"),
)

# One row per (agent, slot): capacity and occupancy in milli-units. The CHECK constraints make
# overcommit and negative occupancy impossible whatever code path writes here.
agent_slots = sa.Table(
    "agent_slots",
    metadata,
    sa.Column(
        "agent_id",
        sa.String(NAME_LEN),
        sa.ForeignKey("agents.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("slot_name", sa.String(NAME_LEN), primary_key=True),
    sa.Column("capacity", sa.BigInteger(), nullable=False),
    sa.Column("occupied", sa.BigInteger(), nullable=False, server_default="0"),
    sa.CheckConstraint("occupied >= 0", name="occupied_not_negative"),
    sa.CheckConstraint("occupied <= capacity", name="no_overcommit"),
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    # The short number users type: cluster-wide, increasing in creation order, never reused
    # (`store.session_numbers`).
    sa.Column("number", BigID, nullable=False),
    sa.Column("name", sa.String(NAME_LEN), nullable=True),
    sa.Column("owner_id", sa.Uuid(), sa.ForeignKey("users.id"), nullable=False),
    sa.Column("project", sa.String(NAME_LEN), nullable=False, server_default="default"),
    sa.Column("type", sa.String(STATUS_LEN), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False, server_default="0"),
    sa.Column(
        "resource_group",
        sa.String(NAME_LEN),
        sa.ForeignKey("resource_groups.name"),
        nullable=False,
    ),
    sa.Column("cluster_mode", sa.String(STATUS_LEN), nullable=False),
    sa.Column("cluster_size", sa.Integer(), nullable=False),
    # image, command, env, per-kernel resources: what the user asked for, as submitted.
    sa.Column("spec", JSONType, nullable=False),
    # What each kernel requests (milli-units) when all of them request the same, else NULL
    # and each kernel's `requested_slots` says. Placement reads the session row alone.
    sa.Column("kernel_slots", JSONType, nullable=True),
    *_status("status", "corral_session_status", SessionStatus),
    sa.Column("status_info", sa.String(512), nullable=True),
    sa.Column("status_changed_at", UTCDateTime(), nullable=False),
    _created(),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("terminated_at", UTCDateTime(), nullable=True),
    sa.Column("result", sa.String(STATUS_LEN), nullable=True),
    sa.Column("failure_cause", sa.String(NAME_LEN), nullable=True),
    sa.Column("exit_code", sa.Integer(), nullable=True),
    sa.Column("creation_id", sa.String(128), nullable=True),
    # The request a creation_id was first used for (`domain.idempotency`; NULL without one).
    sa.Column("creation_fingerprint", JSONType, nullable=True),
    sa.Column("starts_at", UTCDateTime(), nullable=True),
    # Wall-time limit in seconds (None: none); while RUNNING, when it is due to stop (start +
    # limit, set and cleared by the status moves, `status_changes._session_move`).
    sa.Column("time_limit_s", sa.Integer(), nullable=True),
    sa.Column("deadline_at", UTCDateTime(), nullable=True),
    # Attempts of the current phase (handler); reset whenever the status changes.
    sa.Column("phase", sa.String(NAME_LEN), nullable=True),
    sa.Column("phase_attempts", sa.Integer(), nullable=False, server_default="0"),
    # Agents that failed this session; the next placement tries them last.
    sa.Column("failed_agents", JSONType, nullable=False),
    # Requeue state (spec document 2).
    sa.Column("requeue_count", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("requeue_at", UTCDateTime(), nullable=True),
    sa.Column("requeue_active", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column("evicted_at", UTCDateTime(), nullable=True),
    # All-or-nothing admission (spec document 2; migration 0026): the KernelsReady condition
    # (NULL while not admitted), its reason (`domain.admission.KernelsReadyReason`) and last
    # transition; the first eviction of the current requeue cycle, the last eviction's reason,
    # and when the session was deactivated.
    sa.Column("kernels_ready", sa.Boolean(), nullable=True),
    sa.Column("kernels_ready_reason", sa.String(STATUS_LEN), nullable=True),
    sa.Column("kernels_ready_at", UTCDateTime(), nullable=True),
    sa.Column("first_evicted_at", UTCDateTime(), nullable=True),
    sa.Column("eviction_reason", sa.String(NAME_LEN), nullable=True),
    sa.Column("deactivated_at", UTCDateTime(), nullable=True),
    # Retry chain (spec document 5).
    sa.Column(
        "parent_session_id",
        sa.Uuid(),
        sa.ForeignKey("sessions.id", ondelete="SET NULL"),
        nullable=True,
    ),
    sa.Column("retry_count", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("max_retries", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("retry_policy", JSONType, nullable=True),
    sa.Column("retry_cause", sa.String(NAME_LEN), nullable=True),
    # What became of the session's retry once it ended (`domain.retry.decide.RetryDecision`;
    # NULL: not decided yet, or no policy). Migration 0023.
    sa.Column("retry_decision", sa.String(STATUS_LEN), nullable=True),
    # Job array (`domain.arrays`): the array's id (its first element's), this element's index,
    # how many of the array's elements may hold resources at once (NULL: no cap).
    sa.Column("array_id", sa.Uuid(), nullable=True),
    sa.Column("array_index", sa.Integer(), nullable=True),
    sa.Column("array_throttle", sa.Integer(), nullable=True),
    # What users type for the array: its first element's number (`domain.refs`: `12_7`).
    sa.Column("array_number", BigID, nullable=True),
    # The digest of the upload the spec names (also in `spec`): retention finds the uploads
    # no kept session uses through its index.
    sa.Column("upload", sa.String(64), nullable=True),
    sa.CheckConstraint("cluster_size >= 1", name="cluster_size_positive"),
    sa.Index(None, "status", "resource_group"),
    sa.Index(None, "owner_id", "created_at"),
    # Partial: most sessions have neither, and an index entry skipped is a write saved on
    # every status change.
    sa.Index(
        None,
        "parent_session_id",
        postgresql_where=sa.text("parent_session_id IS NOT NULL"),
        sqlite_where=sa.text("parent_session_id IS NOT NULL"),
    ),
    sa.Index("uq_sessions_number", "number", unique=True),
    # Partial: a session is found by its name (`store.session_refs`); most have none.
    sa.Index(
        None,
        "name",
        postgresql_where=sa.text("name IS NOT NULL"),
        sqlite_where=sa.text("name IS NOT NULL"),
    ),
    sa.Index(
        "uq_sessions_owner_id_creation_id",
        "owner_id",
        "creation_id",
        unique=True,
        postgresql_where=sa.text("creation_id IS NOT NULL"),
        sqlite_where=sa.text("creation_id IS NOT NULL"),
    ),
    sa.Index(
        None,
        "array_id",
        postgresql_where=sa.text("array_id IS NOT NULL"),
        sqlite_where=sa.text("array_id IS NOT NULL"),
    ),
    sa.Index(
        "uq_sessions_array_number_array_index",
        "array_number",
        "array_index",
        unique=True,
        postgresql_where=sa.text("array_number IS NOT NULL"),
        sqlite_where=sa.text("array_number IS NOT NULL"),
    ),
    sa.Index(
        None,
        "upload",
        postgresql_where=sa.text("upload IS NOT NULL"),
        sqlite_where=sa.text("upload IS NOT NULL"),
    ),
)

# The running sessions that have a time limit, by deadline (`store.time_limits`).
sa.Index(
    "ix_sessions_deadline_at",
    sessions.c.deadline_at,
    postgresql_where=sa.text("deadline_at IS NOT NULL"),
    sqlite_where=sa.text("deadline_at IS NOT NULL"),
)

# The sessions with a retry policy whose retry is not decided yet (`store.retries`): the retry
# task reads the ended ones from here; a decided session leaves the index. Migration 0023.
sa.Index(
    "ix_sessions_retry_undecided",
    sessions.c.status,
    postgresql_where=sa.text(RETRY_UNDECIDED),
    sqlite_where=sa.text(RETRY_UNDECIDED),
)

# Everyone's sessions newest first (an admin's listing, the dashboard's table). Migration 0027.
sa.Index("ix_sessions_newest_first", sessions.c.created_at, sessions.c.id)

# A group's queue in order, for a scheduling pass's pages (`scheduling.read_queue_page`);
# only PENDING sessions are in it.
sa.Index(
    "ix_sessions_pending_queue",
    sessions.c.resource_group,
    sessions.c.priority.desc(),
    sessions.c.created_at,
    sessions.c.id,
    postgresql_where=sa.text("status = 'PENDING'"),
    sqlite_where=sa.text("status = 'PENDING'"),
)

session_dependencies = sa.Table(
    "session_dependencies",
    metadata,
    sa.Column(
        "session_id",
        sa.Uuid(),
        sa.ForeignKey("sessions.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("depends_on", sa.Uuid(), sa.ForeignKey("sessions.id"), primary_key=True),
    # When the dependant may start (`outcome.DependencyKind`); migration 0016.
    sa.Column(
        "kind",
        sa.String(STATUS_LEN),
        sa.CheckConstraint(
            "kind IN (" + ", ".join(f"'{kind.value}'" for kind in DependencyKind) + ")",
            name="kind_valid",
        ),
        nullable=False,
        server_default=DEFAULT_DEPENDENCY_KIND.value,
    ),
    sa.Index(None, "depends_on"),
)

kernels = sa.Table(
    "kernels",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column(
        "session_id",
        sa.Uuid(),
        sa.ForeignKey("sessions.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("cluster_role", sa.String(STATUS_LEN), nullable=False),
    sa.Column("cluster_index", sa.Integer(), nullable=False),
    # No foreign key: the placement commit checks, under lock, that the agent exists and is
    # ALIVE, and agents are never deleted (they end TERMINATED); a key check here would lock
    # the agent row once per placed kernel (60 of 215 ms when placing 10,000 kernels).
    # Not indexed either: the kernels of an agent are found through `agent_kernels`.
    sa.Column("agent_id", sa.String(NAME_LEN), nullable=True),
    *_status("status", "corral_kernel_status", KernelStatus),
    sa.Column("status_info", sa.String(512), nullable=True),
    sa.Column("status_changed_at", UTCDateTime(), nullable=False),
    _created(),
    # Requested per-kernel slots (milli-units) and, while placed, the slots it occupies.
    sa.Column("requested_slots", JSONType, nullable=False),
    sa.Column("occupied_slots", JSONType, nullable=True),
    # host, ports, pid/container id, as reported by the agent.
    sa.Column("runtime_info", JSONType, nullable=False),
    sa.Column("exit_code", sa.Integer(), nullable=True),
    sa.Column("failure_cause", sa.String(NAME_LEN), nullable=True),
    # What the manager wants the agent to do (KernelIntent), bumped generation per request, and
    # the cause of the agent's last failed attempt at the current stage (retryable, not ERROR).
    sa.Column("desired_state", sa.String(STATUS_LEN), nullable=True),
    sa.Column("desired_generation", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("stage_failure", sa.String(NAME_LEN), nullable=True),
    # Which placement this is: bumped by each one (migration 0018). Assignments and reports
    # carry it, so a report of an earlier placement is never taken for the current one.
    sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
    # A started kernel's agent last confirmed it unchanged, and the manager's question about a
    # kernel its agent has been quiet about, until any report of it answers (migration 0019;
    # `store.kernel_checks`).
    sa.Column("heard_at", UTCDateTime(), nullable=True),
    sa.Column("asked_at", UTCDateTime(), nullable=True),
    # Restarts of the kernel its agents reported (the session's `restart_limit` bounds them),
    # and whether one is under way: down, not yet running again (migration 0032).
    sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("restarting", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.UniqueConstraint("session_id", "cluster_index"),
    # No index names `status` or `agent_id`, and pages are kept 60 % empty: status changes and
    # placements are then HOT updates on PostgreSQL (no index entries written), the bulk of all
    # writes to this table, even when a batch moves every kernel on a page at once and each
    # row grows by its agent and occupied slots (migrations 0006 and 0007).
    postgresql_with={"fillfactor": 40},
)

# The kernels with a failed stage reported, by session (`sessions._attention_query`): a few at
# any time, so the phases find them without reading every kernel they watch. Partial: the
# reports that clear or keep a NULL `stage_failure` still update the row in place (HOT on
# PostgreSQL). Migration 0033.
sa.Index(
    "ix_kernels_stage_failure",
    kernels.c.session_id,
    postgresql_where=sa.text("stage_failure IS NOT NULL"),
    sqlite_where=sa.text("stage_failure IS NOT NULL"),
)

# The kernels of each agent: a row for every kernel whose `agent_id` is set, written by the
# placement that sets it and deleted when it is cleared, so that the kernels of an agent are
# found by an index without indexing `kernels.agent_id` (an index there makes every placement
# a full update of the kernel row: the row copied and three index entries; migration 0007).
# See `store.agent_kernels`.
agent_kernels = sa.Table(
    "agent_kernels",
    metadata,
    sa.Column("agent_id", sa.String(NAME_LEN), primary_key=True),
    sa.Column("kernel_id", sa.Uuid(), primary_key=True),
    # One B-tree on SQLite (the key), not a row table plus the key's index.
    sqlite_with_rowid=False,
)


def _history_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("phase", sa.String(NAME_LEN), nullable=False),
        sa.Column("from_status", sa.String(STATUS_LEN), nullable=True),
        sa.Column("to_status", sa.String(STATUS_LEN), nullable=True),
        sa.Column("result", sa.String(STATUS_LEN), nullable=False),
        sa.Column("error_code", sa.String(NAME_LEN), nullable=True),
        sa.Column("message", sa.Text(), nullable=False, server_default=""),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="1"),
        _created(),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    ]


# History is an append-only log, like `events`: no foreign keys, because a key check locks the
# parent row for every history row written (half the cost of writing history on PostgreSQL).
# Deleting a session deletes its history explicitly.
session_history = sa.Table(
    "session_scheduling_history",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.Uuid(), nullable=False),
    *_history_columns(),
    sa.Index(None, "session_id", "id"),
)

kernel_history = sa.Table(
    "kernel_scheduling_history",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("kernel_id", sa.Uuid(), nullable=False),
    sa.Column("session_id", sa.Uuid(), nullable=False),
    *_history_columns(),
    # By session, as it is read and deleted: a session's kernels' history in order.
    sa.Index(None, "session_id", "id"),
)

deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.String(NAME_LEN), nullable=False),
    sa.Column("owner_id", sa.Uuid(), sa.ForeignKey("users.id"), nullable=False),
    sa.Column(
        "resource_group",
        sa.String(NAME_LEN),
        sa.ForeignKey("resource_groups.name"),
        nullable=False,
    ),
    *_status("lifecycle", "corral_endpoint_lifecycle", EndpointLifecycle),
    sa.Column("replica_spec", JSONType, nullable=False),
    sa.Column("desired_replicas", sa.Integer(), nullable=False),
    # Rolling updates (migration 0028): the spec's revision, and the spec it replaced.
    sa.Column("revision", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("previous_spec", JSONType, nullable=True),
    # Autoscaling (migration 0029): the replica count last recommended, and since when it
    # has been (the autoscaler's delays count from then); NULL: none pending.
    sa.Column("autoscale_wanted", sa.Integer(), nullable=True),
    sa.Column("autoscale_since", UTCDateTime(), nullable=True),
    # Serving access (migration 0031): 'open' or 'token', and the token's SHA-256 (token only).
    sa.Column("access", sa.String(16), nullable=False, server_default="open"),
    sa.Column("token_hash", sa.String(64), nullable=True),
    sa.Column("lifecycle_changed_at", UTCDateTime(), nullable=False),
    _created(),
    sa.CheckConstraint("desired_replicas >= 0", name="replicas_not_negative"),
    sa.UniqueConstraint("owner_id", "name"),
    sa.Index(None, "lifecycle"),
)

routes = sa.Table(
    "routes",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column(
        "deployment_id",
        sa.Uuid(),
        sa.ForeignKey("deployments.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("session_id", sa.Uuid(), sa.ForeignKey("sessions.id"), nullable=True),
    *_status("status", "corral_route_status", RouteStatus),
    sa.Column("health_info", sa.String(512), nullable=True),
    sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
    # Passed probes in a row, and when the manager last probed the route (migration 0028).
    sa.Column("consecutive_successes", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("probed_at", UTCDateTime(), nullable=True),
    # The deployment's spec revision this replica runs (rolling updates, migration 0028).
    sa.Column("revision", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("traffic_weight", sa.Integer(), nullable=False, server_default="100"),
    # Draining (migration 0029): a TERMINATING route with this set gets no new requests and
    # its session ends once no proxy has a request in flight to it, or at this time.
    sa.Column("drain_until", UTCDateTime(), nullable=True),
    sa.Column("host", sa.String(256), nullable=True),
    sa.Column("port", sa.Integer(), nullable=True),
    sa.Column("status_changed_at", UTCDateTime(), nullable=False),
    _created(),
    sa.Index(None, "deployment_id", "status"),
    sa.Index(None, "status"),
)

# History of the deployment and route handlers (spec document 1's comparison table: SUCCESS /
# FAILURE per deployment handler run, SUCCESS / FAILURE / STALE per route handler run), folded
# like the sessions' history; append-only, no foreign keys (migration 0029).
deployment_history = sa.Table(
    "deployment_history",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("deployment_id", sa.Uuid(), nullable=False),
    *_history_columns(),
    sa.Index(None, "deployment_id", "id"),
)

route_history = sa.Table(
    "route_history",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("route_id", sa.Uuid(), nullable=False),
    sa.Column("deployment_id", sa.Uuid(), nullable=False),
    *_history_columns(),
    sa.Index(None, "route_id", "id"),
    sa.Index(None, "deployment_id", "id"),
)

# What each proxy last reported (migration 0029): its requests in flight per deployment and
# replica address ({deployment id: {"host:port": count}}), and the route table revision it
# forwards by. A report older than a few report intervals is the proxy gone: it counts no more.
proxy_reports = sa.Table(
    "proxy_reports",
    metadata,
    sa.Column("proxy_id", sa.String(NAME_LEN), primary_key=True),
    sa.Column("table_revision", sa.BigInteger(), nullable=False),
    sa.Column("inflight", JSONType, nullable=False),
    sa.Column("reported_at", UTCDateTime(), nullable=False),
)

# The append-only audit log; the same rows are fanned out live by the event bus.
events = sa.Table(
    "events",
    metadata,
    sa.Column("id", BigID, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(NAME_LEN), nullable=False),
    sa.Column("entity_type", sa.String(STATUS_LEN), nullable=False),
    sa.Column("entity_id", sa.String(NAME_LEN), nullable=False),
    # Owner of the entity, so the event stream can filter by visibility without a join.
    sa.Column("owner_id", sa.Uuid(), nullable=True),
    sa.Column("payload", JSONType, nullable=False),
    _created(),
    # One entity's events in order (`corral run` follows its session's): no scan of the log.
    # The log is otherwise read by id; an index nothing reads is only a cost on every append
    # (migration 0010 dropped two).
    sa.Index(None, "entity_id", "id"),
)


# Hints for the PostgreSQL hint bus: a set hint is a row; consuming it deletes the row. NOTIFY
# wakes waiting managers at once; the row keeps a hint set for whoever looks next. UNLOGGED on
# PostgreSQL (migration 0011): a hint is not truth, so its writes need not wait for the WAL.
# Named counters, on SQLite only: the next session number is taken from a row here under the
# write lock every writer holds. PostgreSQL uses a sequence of the same name instead
# (`store.session_numbers`), which hands out numbers without a lock held until commit; there
# the table stays empty.
counters = sa.Table(
    "counters",
    metadata,
    sa.Column("name", sa.String(NAME_LEN), primary_key=True),
    sa.Column("value", sa.BigInteger(), nullable=False),
)

# Cluster-wide switches admins flip at run time, one row each (name → JSON value): kept in the
# database so that every manager sees a change at once. `retry.paused` pauses automatic retries
# (`store.retries`). Migration 0023.
cluster_settings = sa.Table(
    "cluster_settings",
    metadata,
    sa.Column("name", sa.String(NAME_LEN), primary_key=True),
    sa.Column("value", JSONType, nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.Column("updated_by", sa.String(NAME_LEN), nullable=True),
)

hints = sa.Table(
    "hints",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("set_at", UTCDateTime(), nullable=False),
    info={"unlogged": True},
)


# Kernels' logs, as agents upload them: one row per chunk, keyed by the chunk's byte offset in
# its stream, so an agent re-sending a chunk after a lost reply writes nothing twice. No foreign
# key (append-only, like history); deleting a session deletes its logs explicitly.
kernel_logs = sa.Table(
    "kernel_logs",
    metadata,
    sa.Column("kernel_id", sa.Uuid(), primary_key=True),
    sa.Column("stream", sa.String(16), primary_key=True),
    sa.Column("byte_offset", sa.BigInteger(), primary_key=True),
    sa.Column("data", sa.LargeBinary(), nullable=False),
    _created(),
    sa.CheckConstraint("stream IN ('stdout', 'stderr')", name="stream_valid"),
    sa.CheckConstraint("byte_offset >= 0", name="offset_not_negative"),
    # `session logs --since`: the first chunk stored at or after a time, from the index alone.
    sa.Index(None, "kernel_id", "stream", "created_at", "byte_offset"),
)

# The files a kernel left in its output directory, uploaded by its agent after it ended.
kernel_outputs = sa.Table(
    "kernel_outputs",
    metadata,
    sa.Column("kernel_id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.String(512), primary_key=True),
    sa.Column("size_bytes", sa.BigInteger(), nullable=False),
    sa.Column("data", sa.LargeBinary(), nullable=False),
    _created(),
)


# Directories users uploaded for their sessions (`corral run --upload`): a tar.gz named by its
# sha256, once per owner. Sessions name one in their spec (`upload`).
uploads = sa.Table(
    "uploads",
    metadata,
    sa.Column(
        "owner_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("size_bytes", sa.BigInteger(), nullable=False),
    sa.Column("data", sa.LargeBinary(), nullable=False),
    _created(),
    # Stored or last asked for by its owner: an upload no session uses is kept this long.
    sa.Column("used_at", UTCDateTime(), nullable=False),
)
