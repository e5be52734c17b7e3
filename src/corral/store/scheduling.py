"""The reads behind a scheduling pass over one resource group, all in the caller's transaction."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.session import PendingSession, SessionWithKernels
from corral.domain.status import SESSION_OCCUPYING, SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.store._direct import DirectStatement
from corral.store._sql import id_batch, in_constants, in_param, payload, slot_entries
from corral.store.agents import AGENT_ALIVE
from corral.store.database import Database, Dialect, loads_or_text
from corral.store.group_options import group_options_naming
from corral.store.sessions import (
    load_pending,
    load_with_kernels,
    memoised,
    pending_view,
    raw_value,
    with_kernels,
)
from corral.store.tables import (
    agent_slots,
    agents,
    kernels,
    resource_groups,
    session_dependencies,
    sessions,
    users,
)

# The statements of a pass are built once and run directly (see `_direct`); the values,
# id lists included (`_sql.in_param`), are parameters.


class UnknownResourceGroupError(LookupError):
    """A resource group that does not exist."""


@record
class AgentSlotRow:
    """One (agent, slot) of a group, with the agent's state."""

    agent_id: AgentId
    usable: bool  # ALIVE and schedulable
    slot_name: str | None  # None: the agent has no slots at all
    capacity: int
    occupied: int


async def read_group_options(db: Database, conn: AsyncConnection, group: str) -> dict[str, Any]:
    """The group's stored options (raises UnknownResourceGroupError if there is no such group).

    From the short-lived cache of every group's options (`group_options`); a group it does not
    hold is looked for once more in a fresh read, so a group created a moment ago is found.
    """
    options = (await group_options_naming(db, conn, [group])).get(group)
    if options is None:
        raise UnknownResourceGroupError(f"resource group {group!r} does not exist")
    return dict(options)


async def read_candidates(
    conn: AsyncConnection,
    dialect: Dialect,
    group: str,
    now: datetime,
    *,
    limit: int | None = None,
    newest_first: bool = False,
    by_eviction: bool = False,
) -> list[PendingSession]:
    """PENDING sessions of the group that may be placed now: due, not deactivated.

    With `limit`, the window is the first `limit` sessions in the group's order: priority
    first, then oldest first (or newest first for LIFO) in the queue (`by_eviction`: an
    evicted session by its last eviction), ties by id, as the sequencers order.
    """
    params: dict[str, Any] = {"group": group, "now": now}
    if limit is not None:
        params["limit"] = limit
    query = _candidates_query(
        limited=limit is not None, newest_first=newest_first, by_eviction=by_eviction
    )
    return await load_pending(conn, dialect, query, params)


# Per group, one probe of the queue index (`ix_sessions_pending_queue`): the cost is the number
# of groups, not of PENDING sessions (a DISTINCT over them took 18 ms with 100,000 queued on
# PostgreSQL). Every session's group is a row of `resource_groups` (a foreign key).
_PENDING_GROUPS = DirectStatement(
    lambda _dialect: (
        sa.select(resource_groups.c.name)
        .where(
            sa.exists().where(
                sessions.c.status == sa.literal_column(f"'{SessionStatus.PENDING.value}'"),
                sessions.c.resource_group == resource_groups.c.name,
            )
        )
        .order_by(resource_groups.c.name)
    )
)


async def read_pending_groups(conn: AsyncConnection) -> list[str]:
    """The resource groups with PENDING sessions, by name."""
    return list(await _PENDING_GROUPS.scalars(conn))


@functools.cache
def _candidates_query(*, limited: bool, newest_first: bool, by_eviction: bool) -> DirectStatement:
    """`read_candidates`' statement, built once per shape (parameters: group, now, limit)."""

    def build(_dialect: Dialect) -> sa.Select[Any]:
        query = pending_view(_is_candidate())
        if not limited:
            return query.order_by(sessions.c.created_at, sessions.c.id)
        return query.order_by(*_queue_order(newest_first, by_eviction)).limit(
            sa.bindparam("limit", type_=sa.Integer())
        )

    return DirectStatement(build)


def _is_candidate() -> sa.ColumnElement[bool]:
    """A PENDING session of the group (parameter `group`) that may be placed at `now`."""
    now = sa.bindparam("now", type_=sessions.c.created_at.type)
    return sa.and_(
        sessions.c.status == sa.literal_column(f"'{SessionStatus.PENDING.value}'", sa.String()),
        sessions.c.resource_group == sa.bindparam("group", type_=sessions.c.resource_group.type),
        sessions.c.requeue_active.is_(True),
        sa.or_(sessions.c.requeue_at.is_(None), sessions.c.requeue_at <= now),
        sa.or_(sessions.c.starts_at.is_(None), sessions.c.starts_at <= now),
    )


def _queued_at(by_eviction: bool) -> sa.ColumnElement[Any]:
    """When a session took its place in the queue: its creation, or with `by_eviction` its
    last eviction if it was evicted (all-or-nothing admission's `requeuing.timestamp` =
    `eviction`, as `order_sessions` orders)."""
    if not by_eviction:
        return sessions.c.created_at
    return sa.func.coalesce(
        sessions.c.evicted_at, sessions.c.created_at, type_=sessions.c.created_at.type
    )


def _queue_order(newest_first: bool, by_eviction: bool) -> tuple[sa.ColumnElement[Any], ...]:
    """A group's queue order, as the FIFO and LIFO sequencers order: priority (higher first),
    then oldest (LIFO: newest) in the queue first, ties by id."""
    queued = _queued_at(by_eviction)
    age = queued.desc() if newest_first else queued.asc()
    return (sessions.c.priority.desc(), age, sessions.c.id)


@record
class QueuePlace:
    """Where a session stands in its group's queue (see `_queue_order`)."""

    priority: int
    queued_at: datetime
    id: SessionId

    @classmethod
    def of(cls, session: SessionWithKernels, *, by_eviction: bool = False) -> QueuePlace:
        queued = session.evicted_at if by_eviction and session.evicted_at else None
        return cls(session.priority, queued or session.created_at, session.id)


@record
class QueueRead:
    """What a pass read of its group's queue: sessions with their kernels, and whether the
    queue may go on after the last of them in queue order."""

    sessions: list[SessionWithKernels]
    more: bool


async def read_queue_page(
    conn: AsyncConnection,
    dialect: Dialect,
    group: str,
    now: datetime,
    *,
    newest_first: bool,
    limit: int | None,
    by_eviction: bool = False,
    after: QueuePlace | None = None,
    free: Mapping[str, int] | None = None,
    at_least: int = 0,
) -> QueueRead:
    """The group's candidates (what `read_candidates` selects) with their kernels: the first
    `limit` in queue order that come after `after` (all of them with `limit` None); with
    `by_eviction` an evicted session's place is by its last eviction (`QueuePlace.of`).

    A scheduling pass reads its queue a page at a time with it, each page after the last
    session of the one before; the page comes back in no particular order. With `free`, the
    slots free in the group in total (milli-units), a page also ends at the first session
    whose demand, added to that of the sessions before it, exceeds them (`_within`), but holds
    at least `at_least` sessions. No pass under strict ordering gets past that session when the
    sessions before it all take their share: not all of them and itself can be placed. Those
    that do not (they wait for a dependency, or can never fit) let the pass read on, a page
    after this one; `at_least` keeps those pages from shrinking to a session or two when
    little is free. Sessions are read whole only as far as the page goes; past it only their
    demand was read. On a nearly full cluster a pass used to read a whole page (5,000 sessions
    with their kernels) to place the few hundred that fit.
    """
    params: dict[str, Any] = {"group": group, "now": now}
    if limit is None:
        return QueueRead(await load_with_kernels(conn, _WHOLE_QUEUE, params), more=False)
    params["limit"] = limit
    if after is not None:
        params.update(
            after_priority=after.priority, after_queued=after.queued_at, after_id=after.id
        )
    query = _queue_page_query(
        newest_first=newest_first, paged=after is not None, by_eviction=by_eviction
    )
    demands = await query.rows(conn, params)
    count = len(demands)
    if free is not None:
        count = min(count, max(_within(demands, free), at_least))
    ids = [row[0] for row in demands[:count]]
    read = (
        await load_with_kernels(conn, _SESSIONS_BY_ID, {"ids": id_batch(dialect, ids).payload})
        if ids
        else []
    )
    return QueueRead(read, more=count < len(demands) or len(demands) == limit)


def _within(demands: Sequence[Sequence[Any]], free: Mapping[str, int]) -> int:
    """How many of `demands` (id, cluster size, per-kernel slots as JSON; in queue order) a
    strict pass can get through: all, or up to and including the first session whose demand,
    added to those before it, exceeds `free`. A session whose kernels differ (no per-kernel
    slots), or whose request is no mapping of whole numbers (placement isolates it), counts as
    demanding nothing: the bound only gets looser."""
    left = dict(free)
    decode = memoised(loads_or_text)  # a page repeats a few request shapes thousands of times
    for index, (_, cluster_size, kernel_slots) in enumerate(demands):
        if kernel_slots is None:
            continue
        per_kernel = decode(kernel_slots)
        if not isinstance(per_kernel, dict):
            continue
        short = False
        for name, amount in per_kernel.items():
            if type(amount) is not int:
                continue
            left[name] = remaining = left.get(name, 0) - amount * cluster_size
            short = short or remaining < 0
        if short:
            return index + 1
    return len(demands)


_WHOLE_QUEUE = DirectStatement(lambda _dialect: with_kernels(_is_candidate()))
_SESSIONS_BY_ID = DirectStatement(
    lambda dialect: with_kernels(in_param(dialect, sessions.c.id, "ids"))
)


@functools.cache
def _queue_page_query(*, newest_first: bool, paged: bool, by_eviction: bool) -> DirectStatement:
    """A page's sessions in queue order with what they demand: id (raw), cluster size and
    per-kernel slots (JSON text). Built once per shape (parameters: group, now, limit,
    after_priority, after_queued, after_id)."""
    s = sessions.c
    page = sa.select(raw_value(s.id), s.cluster_size, sa.cast(s.kernel_slots, sa.Text)).where(
        _is_candidate()
    )
    if paged:
        priority = sa.bindparam("after_priority", type_=s.priority.type)
        queued = _queued_at(by_eviction)
        placed = sa.bindparam("after_queued", type_=s.created_at.type)
        later = queued < placed if newest_first else queued > placed
        page = page.where(
            sa.or_(
                s.priority < priority,
                sa.and_(
                    s.priority == priority,
                    sa.or_(
                        later,
                        sa.and_(
                            queued == placed,
                            s.id > sa.bindparam("after_id", type_=s.id.type),
                        ),
                    ),
                ),
            )
        )
    page = page.order_by(*_queue_order(newest_first, by_eviction)).limit(
        sa.bindparam("limit", type_=sa.Integer())
    )
    return DirectStatement(lambda _dialect: page)


_AGENT_SLOTS = DirectStatement(
    lambda _dialect: (
        sa.select(
            agents.c.id,
            sa.and_(agents.c.status == AGENT_ALIVE, agents.c.schedulable.is_(True)).label("usable"),
            agent_slots.c.slot_name,
            agent_slots.c.capacity,
            agent_slots.c.occupied,
        )
        .select_from(agents.outerjoin(agent_slots, agent_slots.c.agent_id == agents.c.id))
        .where(
            agents.c.resource_group == sa.bindparam("group", type_=agents.c.resource_group.type),
            agents.c.status != "TERMINATED",
        )
        .order_by(agents.c.id, agent_slots.c.slot_name)
    )
)


async def read_agent_slots(conn: AsyncConnection, group: str) -> list[AgentSlotRow]:
    """Every registered agent of the group (all but TERMINATED) with its slot ledger rows."""
    rows = await _AGENT_SLOTS.rows(conn, {"group": group})
    return [
        AgentSlotRow(AgentId(a), bool(usable), slot, capacity or 0, occupied or 0)
        for a, usable, slot, capacity, occupied in rows
    ]


async def read_owner_usage(
    conn: AsyncConnection, dialect: Dialect, group: str
) -> tuple[dict[UserId, int], dict[UserId, dict[str, int]]]:
    """Per owner: sessions holding resources in the group, and the slots their kernels occupy."""
    counts = await _OWNER_SESSIONS.rows(conn, {"group": group})
    session_counts = {UserId(owner): int(n) for owner, n in counts}
    rows = await _OWNER_SLOTS.rows(conn, {"group": group})
    slots: dict[UserId, dict[str, int]] = {}
    for owner, slot, amount in rows:
        slots.setdefault(UserId(owner), {})[slot] = int(amount)
    return session_counts, slots


def _holding() -> sa.ColumnElement[bool]:
    return in_constants(sessions.c.status, [s.value for s in SESSION_OCCUPYING])


def _in_group() -> sa.ColumnElement[bool]:
    return sessions.c.resource_group == sa.bindparam("group", type_=sessions.c.resource_group.type)


_OWNER_SESSIONS = DirectStatement(
    lambda _dialect: (
        sa.select(sessions.c.owner_id, sa.func.count())
        .where(_in_group(), _holding())
        .group_by(sessions.c.owner_id)
    )
)


def _owner_slots(dialect: Dialect) -> sa.Select[Any]:
    each = slot_entries(dialect, kernels.c.occupied_slots)
    return (
        sa.select(
            sessions.c.owner_id, each.c.key, sa.func.sum(sa.cast(each.c.value, sa.BigInteger))
        )
        .select_from(
            sessions.join(kernels, kernels.c.session_id == sessions.c.id).join(each, sa.true())
        )
        .where(_in_group(), _holding(), kernels.c.occupied_slots.is_not(None))
        .group_by(sessions.c.owner_id, each.c.key)
    )


_OWNER_SLOTS = DirectStatement(_owner_slots)


def _dependencies(dialect: Dialect) -> sa.Select[Any]:
    dep = sessions.alias("dependency")
    return (
        sa.select(
            session_dependencies.c.session_id,
            session_dependencies.c.depends_on,
            session_dependencies.c.kind,
            dep.c.status,
            dep.c.result,
            dep.c.number,
        )
        .select_from(
            session_dependencies.outerjoin(dep, dep.c.id == session_dependencies.c.depends_on)
        )
        .where(in_param(dialect, session_dependencies.c.session_id, "ids"))
    )


_DEPENDENCIES = DirectStatement(_dependencies)


async def read_dependencies(
    conn: AsyncConnection, dialect: Dialect, session_ids: Collection[SessionId]
) -> dict[SessionId, list[tuple[uuid.UUID, str, str | None, str | None, int | None]]]:
    """For each session that has dependencies: (dependency id, kind, its status, its result,
    its number); the last three None when the dependency does not exist."""
    if not session_ids:
        return {}
    rows = await _DEPENDENCIES.rows(conn, {"ids": payload(dialect, session_ids)})
    found: dict[SessionId, list[tuple[uuid.UUID, str, str | None, str | None, int | None]]] = {}
    for sid, depends_on, kind, status, result, number in rows:
        found.setdefault(SessionId(sid), []).append((depends_on, kind, status, result, number))
    return found


def _array_active(dialect: Dialect) -> sa.Select[Any]:
    return (
        sa.select(sessions.c.array_id, sa.func.count())
        .where(in_param(dialect, sessions.c.array_id, "ids"), _holding())
        .group_by(sessions.c.array_id)
    )


_ARRAY_ACTIVE = DirectStatement(_array_active)


async def read_array_active(
    conn: AsyncConnection, dialect: Dialect, array_ids: Collection[SessionId]
) -> dict[SessionId, int]:
    """For each of the job arrays, how many of its elements hold resources now (placed, not
    yet ended); an array with none is left out."""
    if not array_ids:
        return {}
    rows = await _ARRAY_ACTIVE.rows(conn, {"ids": payload(dialect, array_ids)})
    return {SessionId(array_id): int(count) for array_id, count in rows}


_OWNERS = DirectStatement(
    lambda dialect: sa.select(users.c.id, users.c.name, users.c.role).where(
        in_param(dialect, users.c.id, "ids")
    )
)


async def read_owners(
    conn: AsyncConnection, dialect: Dialect, owner_ids: Collection[UserId]
) -> dict[UserId, tuple[str, str]]:
    """Each owner's name and role (an owner that does not exist is left out)."""
    if not owner_ids:
        return {}
    rows = await _OWNERS.rows(conn, {"ids": payload(dialect, owner_ids)})
    return {UserId(owner): (name, role) for owner, name, role in rows}
