"""Agents' assignments: the kernels' desired state that handlers write and agents read.

The manager never calls an agent. A handler that wants a kernel prepared, started or stopped
writes the kernel's `desired_state` (bumping its `desired_generation`) and bumps the agent's
`assignment_revision` in the same transaction; the agent, long-polling on its revision, reads
its whole assignment and reconciles. Writing a desired state that is already there changes
nothing and bumps nothing, so handlers may repeat a request freely.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.session import KernelIntent, MilliSlots
from corral.domain.status import KERNEL_TERMINAL, KernelStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store._direct import DirectStatement
from corral.store._sql import IdBatch, in_constants, in_param, payload
from corral.store.agent_kernels import on_agents
from corral.store.agents import AGENT_ALIVE
from corral.store.database import Database, Dialect, loads_or_text
from corral.store.tables import agents, kernels, sessions, users


async def request_kernels(
    conn: AsyncConnection,
    dialect: Dialect,
    session_ids: Collection[SessionId] | IdBatch,
    intent: KernelIntent,
    statuses: Collection[KernelStatus],
    *,
    again: bool = False,
) -> set[AgentId]:
    """Ask the agents of these sessions' kernels in `statuses` for `intent`; bump their revisions.

    Only kernels whose desired state differs (or, with `again`, whose last attempt failed) are
    written: each gets a new generation and its stage failure cleared. Returns the agents bumped.
    """
    if not session_ids:
        return set()
    statement = _request_statement(intent, frozenset(statuses), again)
    agent_ids = await statement.scalars(conn, {"ids": payload(dialect, session_ids)})
    bumped = {AgentId(agent_id) for agent_id in agent_ids}
    await bump_revisions(conn, dialect, bumped)
    return bumped


@functools.cache
def _request_statement(
    intent: KernelIntent, statuses: frozenset[KernelStatus], again: bool
) -> DirectStatement:
    """The request for `intent` (one per intent, statuses and `again`: a handful in all)."""

    def build(dialect: Dialect) -> sa.Update:
        changed = kernels.c.desired_state.is_distinct_from(intent.value)
        if again:
            changed = sa.or_(changed, kernels.c.stage_failure.is_not(None))
        return (
            kernels.update()
            .where(
                in_param(dialect, kernels.c.session_id, "ids"),
                in_constants(kernels.c.status, [s.value for s in statuses]),
                kernels.c.agent_id.is_not(None),
                changed,
            )
            .values(
                desired_state=intent.value,
                desired_generation=kernels.c.desired_generation + 1,
                stage_failure=None,
            )
            .returning(kernels.c.agent_id)
        )

    return DirectStatement(build)


async def bump_revisions(
    conn: AsyncConnection, dialect: Dialect, agent_ids: Collection[AgentId]
) -> None:
    """Tell these agents their assignments changed (their long-polls answer at once)."""
    if not agent_ids:
        return
    await _BUMP_REVISIONS.run(conn, {"ids": payload(dialect, sorted(agent_ids))})


_BUMP_REVISIONS = DirectStatement(
    lambda dialect: update_agents_in_id_order(
        dialect, in_param(dialect, agents.c.id, "ids")
    ).values(assignment_revision=agents.c.assignment_revision + 1)
)


def update_agents_in_id_order(dialect: Dialect, where: sa.ColumnElement[bool]) -> sa.Update:
    """`UPDATE agents` of the agents `where` selects; on PostgreSQL their rows are locked in
    id order first (a locking CTE), whatever plan the update itself gets.

    Every statement that writes many agent rows at once goes through here. Two of them that
    share agents (a heartbeat group commit, a transaction telling agents their assignments
    changed) otherwise take the row locks in the order each plan meets the rows, and can
    deadlock: `corral simulate` on PostgreSQL met "deadlock detected" between exactly those
    two, and the heartbeats lost. SQLite has one writer at a time and needs nothing.
    """
    if dialect != "postgresql":
        return agents.update().where(where)
    locked = (
        sa.select(agents.c.id).where(where).order_by(agents.c.id).with_for_update().cte("locked")
    )
    return agents.update().where(agents.c.id == locked.c.id)


async def agent_statuses(
    conn: AsyncConnection, dialect: Dialect, agent_ids: Collection[AgentId]
) -> dict[AgentId, str]:
    """Each agent's status (ALIVE, LOST, TERMINATED); unknown agents are left out."""
    if not agent_ids:
        return {}
    rows = await _AGENT_STATUSES.rows(conn, {"ids": payload(dialect, agent_ids)})
    return {AgentId(agent_id): status for agent_id, status in rows}


_AGENT_STATUSES = DirectStatement(
    lambda dialect: sa.select(agents.c.id, agents.c.status).where(
        in_param(dialect, agents.c.id, "ids")
    )
)


async def not_ready_for_stage(
    conn: AsyncConnection, dialect: Dialect, session_ids: Collection[SessionId]
) -> set[SessionId]:
    """Those of these sessions that a stage's handler would not ask on: a live kernel of theirs
    is on an agent that is not ALIVE (or on none), or its agent's last attempt at a stage failed
    (one query).

    The rule of `handlers.sessions._agents.sort_stage_attempts`, which reads the sessions and
    says why; this one only says which, inside a transaction that holds them. A test checks
    that both pick the same sessions."""
    if not session_ids:
        return set()
    found = await _NOT_READY_FOR_STAGE.scalars(conn, {"ids": payload(dialect, session_ids)})
    return {SessionId(sid) for sid in found}


_NOT_READY_FOR_STAGE = DirectStatement(
    lambda dialect: (
        sa.select(kernels.c.session_id)
        .distinct()
        .select_from(kernels.outerjoin(agents, agents.c.id == kernels.c.agent_id))
        .where(
            in_param(dialect, kernels.c.session_id, "ids"),
            sa.not_(in_constants(kernels.c.status, [s.value for s in KERNEL_TERMINAL])),
            sa.or_(
                kernels.c.stage_failure.is_not(None),
                agents.c.status.is_distinct_from(AGENT_ALIVE),
            ),
        )
    )
)


async def read_revisions(db: Database, agent_ids: Collection[AgentId]) -> dict[AgentId, int]:
    """The agents' assignment revisions, in one query (unknown agents are left out)."""
    if not agent_ids:
        return {}
    async with db.read_statements() as conn:
        rows = await _REVISIONS.rows(conn, {"ids": payload(db.dialect, agent_ids)})
        return {AgentId(agent_id): int(revision) for agent_id, revision in rows}


_REVISIONS = DirectStatement(
    lambda dialect: sa.select(agents.c.id, agents.c.assignment_revision).where(
        in_param(dialect, agents.c.id, "ids")
    )
)


@record
class AssignedKernel:
    """One kernel an agent is responsible for, with what the manager wants of it."""

    id: KernelId
    session_id: SessionId
    cluster_role: str
    cluster_index: int
    cluster_size: int
    status: KernelStatus
    desired_state: KernelIntent | None
    desired_generation: int
    stage_failure: str | None
    occupied_slots: MilliSlots
    spec: dict[str, Any]  # image, command, env, resources, type: as the user submitted them
    attempt: int = 0  # the kernel's placement (`kernels.attempt`)
    restarts: int = 0  # the kernel's restarts so far (`kernels.restarts`)
    restarting: bool = False  # one is under way (`kernels.restarting`)
    asked: bool = False  # the manager asks the agent what it knows of the kernel (kernel_checks)
    # The address of the agent of every kernel of the session, in cluster-index order ("" for
    # a kernel not placed now), so the ranks of a multi-node session can find each other.
    cluster_hosts: tuple[str, ...] = ()
    # A job array's element: the array's number and this element's index (CORRAL_ARRAY_*).
    array_number: int | None = None
    array_index: int | None = None
    owner: str = ""  # the session owner's user name (an agent may run the kernel as them)


@record
class Assignment:
    """Everything an agent should hold now, at `revision`: its full desired state."""

    agent_id: AgentId
    revision: int
    kernels: tuple[AssignedKernel, ...]
    # Kernels whose rows could not be read (a spec that does not parse...): their sessions,
    # and why, for the reader to isolate (`coordination.quarantine`); left out of `kernels`.
    unreadable: tuple[tuple[SessionId, str], ...] = ()


async def read_assignment(db: Database, agent_id: AgentId) -> Assignment | None:
    """The agent's revision and every non-terminal kernel placed on it (None: no such agent)."""
    return (await read_assignments(db, [agent_id])).get(agent_id)


async def read_assignments(
    db: Database, agent_ids: Collection[AgentId]
) -> dict[AgentId, Assignment]:
    """Each agent's revision and non-terminal kernels, in two queries for all of them (a third
    for the hosts of multi-kernel sessions).

    Unknown agents are left out. The queries need not share a snapshot, as long as the revisions
    are read first: a change committed in between is then in the kernels read but not in the
    revision, so the agent's next poll (since that revision) is answered at once and finds
    nothing new; the other way round, an agent could hold a revision whose kernels it never saw.
    """
    if not agent_ids:
        return {}
    async with db.read_statements() as conn:
        ids = payload(db.dialect, sorted(set(agent_ids)))
        known = await _AGENT_REVISIONS.rows(conn, {"ids": ids})
        if not known:
            return {}
        rows = await _ASSIGNED_KERNELS.rows(conn, {"ids": ids})
        # A single-kernel session's only host is the agent it is assigned to.
        hosts = await _cluster_hosts(conn, db.dialect, {row[1] for row in rows if row[4] > 1})
    addresses = {AgentId(agent_id): (address or "",) for agent_id, _, address in known}
    held: dict[AgentId, list[AssignedKernel]] = {AgentId(row[0]): [] for row in known}
    unreadable: dict[AgentId, list[tuple[SessionId, str]]] = {}
    # Decoded once per distinct text (the kernels of a session share it), shared: read-only.
    specs: dict[str, dict[str, Any]] = {}
    for row in rows:
        agent_id = AgentId(row[11])
        try:
            kernel = _assigned(row, specs, addresses[agent_id], hosts)
        except (ValueError, TypeError, KeyError) as exc:
            # One row no agent could be sent: its session is isolated, the others go out.
            unreadable.setdefault(agent_id, []).append((SessionId(row[1]), str(exc)[:200]))
            continue
        held[agent_id].append(kernel)
    return {
        agent_id: Assignment(
            agent_id=agent_id,
            revision=int(revision),
            kernels=tuple(held[agent_id]),
            unreadable=tuple(unreadable.get(agent_id, ())),
        )
        for agent_id, revision, _ in known
    }


def _assigned(
    row: Sequence[Any],
    specs: dict[str, dict[str, Any]],
    address: tuple[str, ...],
    hosts: Mapping[Any, tuple[str, ...]],
) -> AssignedKernel:
    """One row of `_ASSIGNED_KERNELS` as an assigned kernel (`specs`: decoded so far)."""
    spec = specs.get(row[10])
    if spec is None:
        spec = loads_or_text(row[10])
        if not isinstance(spec, dict):
            raise TypeError(f"the session's spec is no JSON object: {row[10][:80]!r}")
        specs[row[10]] = spec
    return AssignedKernel(
        id=KernelId(row[0]),
        session_id=SessionId(row[1]),
        cluster_role=row[2],
        cluster_index=row[3],
        cluster_size=row[4],
        status=KernelStatus(row[5]),
        desired_state=KernelIntent(row[6]) if row[6] is not None else None,
        desired_generation=row[7],
        stage_failure=row[8],
        occupied_slots=row[9] or {},
        spec=spec,
        attempt=row[12],
        asked=row[13] is not None,
        cluster_hosts=address if row[4] == 1 else hosts.get(row[1], ()),
        array_number=row[14],
        array_index=row[15],
        owner=row[16],
        restarts=row[17],
        restarting=bool(row[18]),
    )


_AGENT_REVISIONS = DirectStatement(
    lambda dialect: sa.select(agents.c.id, agents.c.assignment_revision, agents.c.address).where(
        in_param(dialect, agents.c.id, "ids")
    )
)


def _assigned_kernels_query(dialect: Dialect) -> sa.Select[Any]:
    return (
        sa.select(
            kernels.c.id,
            kernels.c.session_id,
            kernels.c.cluster_role,
            kernels.c.cluster_index,
            sessions.c.cluster_size,
            kernels.c.status,
            kernels.c.desired_state,
            kernels.c.desired_generation,
            kernels.c.stage_failure,
            kernels.c.occupied_slots,
            sa.cast(sessions.c.spec, sa.Text),  # decoded by the reader, once per distinct text
            kernels.c.agent_id,
            kernels.c.attempt,
            kernels.c.asked_at,
            sessions.c.array_number,
            sessions.c.array_index,
            users.c.name,
            kernels.c.restarts,
            kernels.c.restarting,
        )
        .select_from(
            kernels.join(sessions, sessions.c.id == kernels.c.session_id).join(
                users, users.c.id == sessions.c.owner_id
            )
        )
        .where(
            on_agents(dialect, "ids"),
            sa.not_(in_constants(kernels.c.status, [s.value for s in KERNEL_TERMINAL])),
        )
        .order_by(kernels.c.agent_id, kernels.c.session_id, kernels.c.cluster_index)
    )


_ASSIGNED_KERNELS = DirectStatement(_assigned_kernels_query)


async def _cluster_hosts(
    conn: AsyncConnection, dialect: Dialect, session_ids: Collection[SessionId]
) -> dict[SessionId, tuple[str, ...]]:
    """Per session, the address of each kernel's agent in cluster-index order (one query)."""
    if not session_ids:
        return {}
    rows = await _HOSTS.rows(conn, {"ids": payload(dialect, session_ids)})
    hosts: dict[SessionId, list[str]] = {}
    for session_id, _, address in rows:
        hosts.setdefault(SessionId(session_id), []).append(address or "")
    return {sid: tuple(h) for sid, h in hosts.items()}


_HOSTS = DirectStatement(
    lambda dialect: (
        sa.select(kernels.c.session_id, kernels.c.cluster_index, agents.c.address)
        .select_from(kernels.outerjoin(agents, agents.c.id == kernels.c.agent_id))
        .where(in_param(dialect, kernels.c.session_id, "ids"))
        .order_by(kernels.c.session_id, kernels.c.cluster_index)
    )
)
