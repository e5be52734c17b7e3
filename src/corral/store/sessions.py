"""Sessions and kernels: creation, and the batched queries the handlers load their targets with.

Every query here works on a batch: one statement for all sessions of a phase, never one per
session. Status changes live in `store.status_changes`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.results import KernelMatchType
from corral.domain.session import (
    KernelIntent,
    KernelRecord,
    KernelState,
    MilliSlots,
    NewSession,
    PendingSession,
    SessionProgress,
    SessionWithKernels,
)
from corral.domain.status import (
    KERNEL_STATUS_BY_VALUE,
    KERNEL_TERMINAL,
    SESSION_STATUS_BY_VALUE,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import AgentId, KernelId, SessionId, UserId, new_kernel_id
from corral.store._direct import DirectStatement, insert_columns
from corral.store._sql import in_constants, in_param, in_values, payload
from corral.store._uuids import uuid_result_processor
from corral.store.agents import AGENT_ALIVE
from corral.store.database import Database, Dialect, loads_or_text
from corral.store.session_numbers import take_session_numbers
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes
from corral.store.tables import agent_kernels, agents, kernels, session_dependencies, sessions


class SessionRepository:
    """Named, batched queries over sessions and kernels."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def dialect(self) -> Dialect:
        return self.db.dialect

    async def insert(self, new_sessions: Sequence[NewSession], now: datetime) -> None:
        """Create sessions, their PENDING kernels and dependencies, in one transaction."""
        if not new_sessions:
            return
        async with self.db.transaction() as conn:
            await insert_sessions(conn, new_sessions, now)

    async def load(
        self,
        statuses: Collection[SessionStatus],
        *,
        kernel_statuses: Collection[KernelStatus] | None = None,
        resource_group: str | None = None,
        limit: int | None = None,
        entered_before: datetime | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[SessionWithKernels]:
        """Sessions in `statuses` with all their kernels, oldest first, in one query.

        With `kernel_statuses`, only sessions that have at least one kernel in one of them;
        with `entered_before`, only those that entered their status before then. With `conn`,
        read in the caller's transaction.
        """
        statement = _load_query(
            tuple(sorted(s.value for s in statuses)),
            None if kernel_statuses is None else tuple(sorted(k.value for k in kernel_statuses)),
            by_group=resource_group is not None,
            limited=limit is not None,
            timed=entered_before is not None,
        )
        params: dict[str, Any] = {}
        if resource_group is not None:
            params["group"] = resource_group
        if limit is not None:
            params["limit"] = limit
        if entered_before is not None:
            params["entered_before"] = entered_before
        return await self._load(conn, statement, params)

    async def load_needing_attention(
        self,
        statuses: Collection[SessionStatus],
        watched: Collection[SessionStatus],
        expiring_before: datetime | None,
        *,
        conn: AsyncConnection | None = None,
    ) -> list[SessionWithKernels]:
        """Like `load`, but a session in `watched` only when something may have to be done.

        That is: a live kernel of it has a stage failure reported or is on an agent that is
        not ALIVE (an agent is removed only once none of its kernels is live), or it entered
        its status before `expiring_before` (None: it never expires). See
        `LifecycleHandler.watched_session_statuses`. With `conn`, read in the caller's
        transaction.
        """
        acted = tuple(sorted(s.value for s in statuses if s not in watched))
        statement = _attention_query(
            acted, tuple(sorted(s.value for s in watched)), timed=expiring_before is not None
        )
        params = {} if expiring_before is None else {"expiring_before": expiring_before}
        return await self._load(conn, statement, params)

    async def _load(
        self,
        conn: AsyncConnection | None,
        statement: DirectStatement,
        params: Mapping[str, Any],
    ) -> list[SessionWithKernels]:
        """`load_with_kernels` in the caller's transaction, or in a read of its own."""
        if conn is not None:
            return await load_with_kernels(conn, statement, params)
        async with self.db.read_statements() as own:  # one statement
            return await load_with_kernels(own, statement, params)

    async def get(self, session_ids: Collection[SessionId]) -> list[SessionWithKernels]:
        """The given sessions with their kernels (missing ids are left out)."""
        if not session_ids:
            return []
        async with self.db.read_statements() as conn:  # one statement
            return await load_with_kernels(
                conn, _BY_IDS, {"ids": payload(self.dialect, session_ids)}
            )

    async def progress(self, session_ids: Collection[SessionId]) -> list[SessionProgress]:
        """The sessions' statuses and kernels as the promotions judge them, in one query
        (missing ids are left out)."""
        if not session_ids:
            return []
        async with self.db.read_statements() as conn:  # one statement
            rows = await _PROGRESS.rows(conn, {"ids": payload(self.dialect, session_ids)})
        found: dict[
            SessionId, tuple[SessionStatus, datetime | None, str | None, list[KernelState]]
        ] = {}
        session_status_of, kernel_status_of = SESSION_STATUS_BY_VALUE, KERNEL_STATUS_BY_VALUE
        stop = KernelIntent.STOP.value
        for (
            sid, status, started_at, asked, role, index, kernel_status, exit_code, cause, desired
        ) in rows:  # fmt: skip
            session = found.get(sid)
            if session is None:
                session = found[sid] = (session_status_of[status], started_at, asked, [])
            if role is not None:
                state = kernel_status_of[kernel_status]
                stopped = desired == stop
                session[3].append(KernelState(role, index, state, exit_code, cause, stopped))
        return [
            SessionProgress(sid, status, started_at, tuple(states), asked)
            for sid, (status, started_at, asked, states) in found.items()
        ]

    async def promotable(
        self,
        statuses: Collection[SessionStatus],
        kernel_statuses: Collection[KernelStatus],
        match: KernelMatchType,
    ) -> set[SessionId]:
        """The sessions in `statuses` whose kernels meet `match` against `kernel_statuses`.

        One query, as in spec document 1: ALL is "no kernel outside the set", ANY "some kernel
        inside it", NOT_ANY "no kernel inside it" (a session without kernels meets ALL and
        NOT_ANY).
        """
        statement = _promotable_query(
            tuple(sorted(s.value for s in statuses)),
            tuple(sorted(k.value for k in kernel_statuses)),
            match,
        )
        async with self.db.read_statements() as conn:
            return {SessionId(sid) for sid in await statement.scalars(conn)}

    async def any_kernel_in(
        self, session_ids: Collection[SessionId], kernel_statuses: Collection[KernelStatus]
    ) -> bool:
        """Whether a kernel of these sessions is in `kernel_statuses` (an indexed look-up each)."""
        if not session_ids:
            return False
        statement = _any_kernel_in_query(tuple(sorted(k.value for k in kernel_statuses)))
        async with self.db.read_statements() as conn:
            found = await statement.scalars(conn, {"ids": payload(self.dialect, session_ids)})
        return bool(found)

    async def apply(self, changes: Sequence[StatusChange], now: datetime) -> AppliedChanges:
        """Apply judged changes in one transaction: guarded moves, slot release, history."""
        return await apply_changes(self.db, changes, now)


def _session_row(
    s: NewSession, number: int, now: datetime, array_number: int | None
) -> dict[str, Any]:
    return {
        "id": s.id,
        "number": number,
        "name": s.name,
        "owner_id": s.owner_id,
        "project": s.project,
        "type": s.type,
        "priority": s.priority,
        "resource_group": s.resource_group,
        "cluster_mode": s.cluster_mode,
        "cluster_size": s.cluster_size,
        "spec": _plain(s.spec),
        "kernel_slots": _plain(s.kernel_slots),  # every kernel asks the same (`_kernel_rows`)
        "status": SessionStatus.PENDING.value,
        "status_changed_at": now,
        "created_at": now,
        "creation_id": s.creation_id,
        "creation_fingerprint": (
            dict(s.creation_fingerprint) if s.creation_fingerprint is not None else None
        ),
        "starts_at": s.starts_at,
        "time_limit_s": s.time_limit_s,
        "phase_attempts": 0,
        "failed_agents": _NO_AGENTS,
        "requeue_count": 0,
        "requeue_active": True,
        "retry_count": s.retry_count,
        "max_retries": s.max_retries,
        "retry_policy": None if s.retry_policy is None else _plain(s.retry_policy),
        "parent_session_id": s.parent_session_id,
        "retry_cause": s.retry_cause,
        "array_id": s.array.array_id if s.array else None,
        "array_index": s.array.index if s.array else None,
        "array_throttle": s.array.throttle if s.array else None,
        "array_number": array_number,
        "upload": s.spec.get("upload"),
    }


# A new session has failed on no agent: one value for every row (immutable), so a batch encodes
# it once.
_NO_AGENTS: tuple[str, ...] = ()


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """`value` as a dict, for JSON; the same object if it is one, so the rows of sessions that
    share it (a retry policy: a few among thousands of sessions) share it, and a batch's insert
    encodes it once (`_direct._convert_rows`). Never changed once written."""
    return value if type(value) is dict else dict(value)


def _kernel_rows(s: NewSession, now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "id": new_kernel_id(),
            "session_id": s.id,
            "cluster_role": "main" if index == 0 else "sub",
            "cluster_index": index,
            "status": KernelStatus.PENDING.value,
            "status_changed_at": now,
            "created_at": now,
            "requested_slots": _plain(s.kernel_slots),
            "runtime_info": {},
        }
        for index in range(s.cluster_size)
    ]


async def insert_sessions(
    conn: AsyncConnection, new_sessions: Sequence[NewSession], now: datetime
) -> list[dict[str, Any]]:
    """Create sessions, their PENDING kernels and dependencies, in the caller's transaction.

    Each session is given the next session number, in the order of `new_sessions`. Returns
    the session rows as written (column → value, unset columns left out), each with its
    kernel rows under `kernels`, in the order of `new_sessions`.
    """
    if not new_sessions:
        return []
    numbers = await take_session_numbers(conn, len(new_sessions))
    array_numbers = await _array_numbers(conn, new_sessions, numbers)
    session_rows = [
        _session_row(s, number, now, array_numbers.get(s.array.array_id) if s.array else None)
        for s, number in zip(new_sessions, numbers, strict=True)
    ]
    kernel_rows = [_kernel_rows(s, now) for s in new_sessions]
    await _INSERT_SESSION.run_many(conn, session_rows)
    await _INSERT_KERNEL.run_many(conn, [row for rows in kernel_rows for row in rows])
    deps = [
        {"session_id": s.id, "depends_on": on, "kind": kind.value}
        for s in new_sessions
        for on, kind in s.dependencies
    ]
    await _INSERT_DEPENDENCY.run_many(conn, deps)  # nothing sent when there are none
    return [row | {"kernels": rows} for row, rows in zip(session_rows, kernel_rows, strict=True)]


async def _array_numbers(
    conn: AsyncConnection, new_sessions: Sequence[NewSession], numbers: Sequence[int]
) -> dict[SessionId, int]:
    """The number of each array the new sessions are elements of: its first element's."""
    heads = {s.array.array_id for s in new_sessions if s.array is not None}
    if not heads:
        return {}
    found = {s.id: n for s, n in zip(new_sessions, numbers, strict=True) if s.id in heads}
    # An array's first element is written with the rest (one transaction), unless a repeated
    # creation_id found it written before.
    for head in heads - found.keys():
        number = await conn.scalar(sa.select(sessions.c.number).where(sessions.c.id == head))
        if number is not None:
            found[head] = number
    return found


# Run once per row (executemany), with the rows of `_session_row` and `_kernel_rows`: their
# keys are the columns written.
_INSERT_SESSION = insert_columns(
    sessions,
    (
        "id",
        "number",
        "name",
        "owner_id",
        "project",
        "type",
        "priority",
        "resource_group",
        "cluster_mode",
        "cluster_size",
        "spec",
        "kernel_slots",
        "status",
        "status_changed_at",
        "created_at",
        "creation_id",
        "creation_fingerprint",
        "starts_at",
        "time_limit_s",
        "phase_attempts",
        "failed_agents",
        "requeue_count",
        "requeue_active",
        "retry_count",
        "max_retries",
        "retry_policy",
        "parent_session_id",
        "retry_cause",
        "array_id",
        "array_index",
        "array_throttle",
        "array_number",
        "upload",
    ),
)
_INSERT_KERNEL = insert_columns(
    kernels,
    (
        "id",
        "session_id",
        "cluster_role",
        "cluster_index",
        "status",
        "status_changed_at",
        "created_at",
        "requested_slots",
        "runtime_info",
    ),
)
_INSERT_DEPENDENCY = insert_columns(session_dependencies, ("session_id", "depends_on", "kind"))


@functools.cache
def _any_kernel_in_query(kernel_statuses: tuple[str, ...]) -> DirectStatement:
    return DirectStatement(
        lambda dialect: (
            sa.select(kernels.c.session_id)
            .where(
                in_param(dialect, kernels.c.session_id, "ids"),
                in_constants(kernels.c.status, kernel_statuses),
            )
            .limit(1)
        )
    )


@functools.cache
def _promotable_query(
    statuses: tuple[str, ...], kernel_statuses: tuple[str, ...], match: KernelMatchType
) -> DirectStatement:
    in_set = in_constants(kernels.c.status, kernel_statuses)
    kernel_of_session = kernels.c.session_id == sessions.c.id
    if match is KernelMatchType.ALL:
        condition = ~sa.exists().where(kernel_of_session, sa.not_(in_set))
    elif match is KernelMatchType.ANY:
        condition = sa.exists().where(kernel_of_session, in_set)
    else:
        condition = ~sa.exists().where(kernel_of_session, in_set)
    return DirectStatement(
        lambda _dialect: sa.select(sessions.c.id).where(
            in_constants(sessions.c.status, statuses), condition
        )
    )


@functools.cache
def _load_query(
    statuses: tuple[str, ...],
    kernel_statuses: tuple[str, ...] | None,
    *,
    by_group: bool,
    limited: bool,
    timed: bool = False,
) -> DirectStatement:
    """`SessionRepository.load`'s statement, built once per shape (parameters: group, limit,
    entered_before)."""
    query = sa.select(sessions.c.id).where(in_constants(sessions.c.status, statuses))
    if timed:
        query = query.where(
            sessions.c.status_changed_at
            < sa.bindparam("entered_before", type_=sessions.c.status_changed_at.type)
        )
    if by_group:
        query = query.where(
            sessions.c.resource_group == sa.bindparam("group", type_=sessions.c.resource_group.type)
        )
    if kernel_statuses is not None:
        query = query.where(
            sa.exists().where(
                kernels.c.session_id == sessions.c.id,
                in_constants(kernels.c.status, kernel_statuses),
            )
        )
    if limited:
        query = query.order_by(sessions.c.created_at, sessions.c.id).limit(
            sa.bindparam("limit", type_=sa.Integer())
        )
    where = sessions.c.id.in_(query.scalar_subquery())
    return DirectStatement(lambda _dialect: with_kernels(where))


@functools.cache
def _attention_query(
    acted: tuple[str, ...], watched: tuple[str, ...], *, timed: bool
) -> DirectStatement:
    """`load_needing_attention`'s statement, built once per shape (parameter: expiring_before).

    The troubled sessions come from the few kernels in trouble (a partial index holds those
    with a stage failure; the agents not ALIVE lead to theirs through `agent_kernels`), not from
    reading every watched session's kernels on each run: a phase that watches thousands of
    sessions read 2-3 kernel and agent rows for each of them, a third of its query's time.
    """
    s, k = sessions.c, kernels.alias("troubled_kernel").c  # the outer query joins `kernels`
    live = sa.not_(in_constants(k.status, [status.value for status in KERNEL_TERMINAL]))
    stage_failed = sa.select(k.session_id).where(k.stage_failure.is_not(None), live)
    not_alive = sa.select(agents.c.id).where(agents.c.status != AGENT_ALIVE)
    on_lost_agent = sa.select(k.session_id).where(
        k.id.in_(
            sa.select(agent_kernels.c.kernel_id).where(agent_kernels.c.agent_id.in_(not_alive))
        ),
        k.agent_id.in_(not_alive),
        live,
    )
    in_watched = in_constants(s.status, watched)
    needing: list[sa.ColumnElement[bool]] = [
        in_constants(s.status, acted),
        sa.and_(in_watched, s.id.in_(sa.union_all(stage_failed, on_lost_agent))),
    ]
    if timed:
        entered = sa.bindparam("expiring_before", type_=s.status_changed_at.type)
        needing.append(sa.and_(in_watched, s.status_changed_at < entered))
    return DirectStatement(lambda _dialect: with_kernels(sa.or_(*needing)))


# `SessionRepository.progress`: a row per kernel (one with no kernel columns for a session
# without kernels), each session's rows together.
_PROGRESS = DirectStatement(
    lambda dialect: (
        sa.select(
            sessions.c.id,
            sessions.c.status,
            sessions.c.started_at,
            sessions.c.failure_cause,
            kernels.c.cluster_role,
            kernels.c.cluster_index,
            kernels.c.status,
            kernels.c.exit_code,
            kernels.c.failure_cause,
            kernels.c.desired_state,
        )
        .select_from(sessions.outerjoin(kernels, kernels.c.session_id == sessions.c.id))
        .where(in_param(dialect, sessions.c.id, "ids"))
        .order_by(sessions.c.id, kernels.c.cluster_index)
    )
)
_BY_IDS = DirectStatement(lambda dialect: with_kernels(in_param(dialect, sessions.c.id, "ids")))


def with_kernels(where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The sessions matching `where` with every kernel of theirs, oldest session first.

    Ids, timestamps and booleans come back as the driver returns them (`raw_value`): each row
    repeats its session's columns, and `load_with_kernels` converts them once per session.
    """
    s, k = sessions.c, kernels.c
    return (
        sa.select(
            raw_value(s.id),
            s.name,
            raw_value(s.owner_id),
            s.type,
            s.priority,
            s.resource_group,
            s.cluster_mode,
            s.cluster_size,
            s.status,
            s.status_info,
            raw_value(s.status_changed_at),
            raw_value(s.created_at),
            raw_value(s.starts_at),
            raw_value(s.requeue_at),
            raw_value(s.requeue_active),
            s.phase,
            s.phase_attempts,
            sa.cast(s.failed_agents, sa.Text),
            s.creation_id,
            raw_value(k.id),
            k.cluster_role,
            k.cluster_index,
            k.agent_id,
            k.status,
            raw_value(k.status_changed_at),
            sa.cast(k.requested_slots, sa.Text),
            sa.cast(k.occupied_slots, sa.Text),
            k.exit_code,
            k.failure_cause,
            k.desired_state,
            k.desired_generation,
            k.stage_failure,
            raw_value(s.started_at),
            raw_value(s.array_id),
            s.array_throttle,
            raw_value(s.evicted_at),
        )
        .select_from(sessions.join(kernels, k.session_id == s.id))
        .where(where)
        .order_by(s.created_at, s.id, k.cluster_index)
    )


def raw_value(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """`column` as the driver returns it: SQLAlchemy converts nothing (see `_Decoders`)."""
    return sa.type_coerce(column, sa.types.NullType())


_INTENTS = {intent.value: intent for intent in KernelIntent}


def _same(value: Any) -> Any:
    return value


class _Decoders:
    """A dialect's conversions of `raw_value` values, exactly what the columns' own types would do.

    On SQLite UUIDs are hex text, timestamps text and booleans integers; on PostgreSQL the
    driver's values need (almost) nothing.
    """

    def __init__(self, dialect: sa.Dialect) -> None:
        self.uuid = uuid_result_processor(sessions.c.id.type, dialect) or _same
        self.time = self._processor(dialect, sessions.c.created_at)
        self.bool = self._processor(dialect, sessions.c.requeue_active)

    @staticmethod
    def _processor(dialect: sa.Dialect, column: sa.Column[Any]) -> Callable[[Any], Any]:
        process = column.type.dialect_impl(dialect).result_processor(dialect, None)
        return _same if process is None else process


_DECODERS: dict[str, _Decoders] = {}


def _decoders(dialect: sa.Dialect) -> _Decoders:
    """The decoders of a dialect, built once per dialect name (corral configures each alike)."""
    found = _DECODERS.get(dialect.name)
    if found is None:
        found = _DECODERS[dialect.name] = _Decoders(dialect)
    return found


async def load_with_kernels(
    conn: AsyncConnection, statement: DirectStatement, params: Mapping[str, Any]
) -> list[SessionWithKernels]:
    """Sessions with their kernels: the rows of a `with_kernels` statement, run with `params`."""
    rows = await statement.rows(conn, params)
    loaders = _Loaders.of(conn.dialect)
    to_uuid, load_time, load_json = loaders.uuid, loaders.time, loaders.json
    result: list[SessionWithKernels] = []
    head: Sequence[Any] | None = None  # the current session's first row
    session_id: Any = None  # the current session's id (a SessionId once `head` is set)
    session_kernels: list[KernelRecord] = []
    raw_id: Any = None
    for row in rows:
        if head is None or row[0] != raw_id:
            if head is not None:
                result.append(_session(head, session_id, tuple(session_kernels), loaders))
            head, raw_id, session_kernels = row, row[0], []
            session_id = SessionId(to_uuid(raw_id))
        session_kernels.append(
            KernelRecord(
                KernelId(to_uuid(row[19])),
                session_id,
                row[20],
                row[21],
                row[22],
                KERNEL_STATUS_BY_VALUE[row[23]],
                load_time(row[24]),
                load_json(row[25]),
                load_json(row[26]),
                row[27],
                row[28],
                None if row[29] is None else _INTENTS[row[29]],
                row[30],
                row[31],
            )
        )
    if head is not None:
        result.append(_session(head, session_id, tuple(session_kernels), loaders))
    return result


def pending_view(where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The sessions matching `where` as placement sees them (`load_pending`): one row each.

    A row carries the request all its kernels make; the kernels' own rows are read only for a
    session whose kernels ask different amounts (none today: every kernel of a session is
    created with the same request).
    """
    s = sessions.c
    return (
        sa.select(
            raw_value(s.id),
            s.name,
            raw_value(s.owner_id),
            s.priority,
            s.resource_group,
            s.cluster_mode,
            s.cluster_size,
            s.status,
            raw_value(s.created_at),
            raw_value(s.starts_at),
            raw_value(s.requeue_at),
            raw_value(s.requeue_active),
            sa.cast(s.failed_agents, sa.Text),
            sa.cast(s.kernel_slots, sa.Text),
            raw_value(s.array_id),
            s.array_throttle,
            raw_value(s.evicted_at),
        )
        .select_from(sessions)
        .where(where)
    )


_KERNEL_REQUESTS = sa.select(
    kernels.c.session_id, kernels.c.cluster_index, kernels.c.requested_slots
).order_by(kernels.c.session_id, kernels.c.cluster_index)


async def load_pending(
    conn: AsyncConnection,
    dialect: Dialect,
    statement: DirectStatement,
    params: Mapping[str, Any],
) -> list[PendingSession]:
    """Sessions for placement: the rows of a `pending_view` statement, run with `params`."""
    rows = await statement.rows(conn, params)
    load = _Loaders.of(conn.dialect)
    mixed: list[SessionId] = []
    result: list[PendingSession] = []
    for row in rows:
        sid = SessionId(load.uuid(row[0]))
        if row[13] is None:
            mixed.append(sid)
        result.append(
            PendingSession(
                id=sid,
                name=row[1],
                owner_id=UserId(load.owner(row[2])),
                priority=row[3],
                resource_group=row[4],
                cluster_mode=row[5],
                status=SESSION_STATUS_BY_VALUE[row[7]],
                created_at=load.time(row[8]),
                starts_at=load.time(row[9]),
                requeue_at=load.time(row[10]),
                requeue_active=load.bool(row[11]),
                failed_agents=tuple(AgentId(a) for a in load.json(row[12])),
                kernel_slots=() if row[13] is None else (load.json(row[13]),) * row[6],
                array_id=None if row[14] is None else SessionId(load.uuid(row[14])),
                array_throttle=row[15],
                evicted_at=load.time(row[16]),
            )
        )
    if not mixed:
        return result
    each: dict[SessionId, list[MilliSlots]] = {}
    kernel_rows = await conn.execute(
        _KERNEL_REQUESTS.where(in_values(dialect, kernels.c.session_id, mixed))
    )
    for sid, _, slots in kernel_rows:
        each.setdefault(SessionId(sid), []).append(slots)
    return [
        dataclasses.replace(p, kernel_slots=tuple(each[p.id])) if p.id in each else p
        for p in result
    ]


@record
class _Loaders:
    """How one load converts the raw values of its rows."""

    uuid: Callable[[Any], Any]
    owner: Callable[[Any], Any]
    time: Callable[[Any], Any]
    json: Callable[[Any], Any]
    bool: Callable[[Any], Any]

    @classmethod
    def of(cls, dialect: sa.Dialect) -> _Loaders:
        """Fresh converters for one load on `dialect`.

        JSON comes back as text and is decoded once per distinct value: a batch repeats a few
        request shapes thousands of times. The decoded values are shared: read-only.
        Timestamps and owners likewise: a session's kernels mostly share theirs, and owners
        are few.
        """
        decode = _decoders(dialect)
        return cls(
            uuid=decode.uuid,
            owner=memoised(decode.uuid),
            time=memoised(decode.time),
            json=memoised(loads_or_text),
            bool=decode.bool,
        )


def memoised(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`convert`, run once per distinct raw value (None stays None)."""
    seen: dict[Any, Any] = {}

    def load(raw: Any) -> Any:
        if raw is None:
            return None
        value = seen.get(raw)
        if value is None:
            value = seen[raw] = convert(raw)
        return value

    return load


def _session(
    row: Sequence[Any], session_id: SessionId, kernels: tuple[KernelRecord, ...], load: _Loaders
) -> SessionWithKernels:
    """The session of a `with_kernels` row (its first), with its kernels (built positionally:
    a session made by keywords from a dict cost twice as much)."""
    return SessionWithKernels(
        session_id,
        row[1],
        UserId(load.owner(row[2])),
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        SESSION_STATUS_BY_VALUE[row[8]],
        row[9],
        load.time(row[10]),
        load.time(row[11]),
        load.time(row[12]),
        load.time(row[13]),
        load.bool(row[14]),
        row[15],
        row[16],
        tuple(AgentId(a) for a in load.json(row[17])),
        row[18],
        kernels,
        load.time(row[32]),
        None if row[33] is None else SessionId(load.uuid(row[33])),
        row[34],
        load.time(row[35]),
    )
