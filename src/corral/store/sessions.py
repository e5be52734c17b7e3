"""Sessions and kernels: creation, and the batched queries the handlers load their targets with.

Every query here works on a batch: one statement for all sessions of a phase, never one per
session. Status changes live in `store.status_changes`.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.results import KernelMatchType
from corral.domain.session import KernelIntent, KernelRecord, NewSession, SessionWithKernels
from corral.domain.status import KERNEL_TERMINAL, KernelStatus, SessionStatus
from corral.domain.types import AgentId, KernelId, SessionId, UserId
from corral.store._sql import in_param, payload
from corral.store.agents import AGENT_ALIVE
from corral.store.database import Database, Dialect
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes
from corral.store.tables import agents, kernels, session_dependencies, sessions


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
    ) -> list[SessionWithKernels]:
        """Sessions in `statuses` with all their kernels, oldest first, in one query.

        With `kernel_statuses`, only sessions that have at least one kernel in one of them.
        """
        query = _load_query(
            tuple(sorted(s.value for s in statuses)),
            None if kernel_statuses is None else tuple(sorted(k.value for k in kernel_statuses)),
            by_group=resource_group is not None,
            limited=limit is not None,
        )
        params: dict[str, Any] = {}
        if resource_group is not None:
            params["group"] = resource_group
        if limit is not None:
            params["limit"] = limit
        async with self.db.read() as conn:
            return await load_with_kernels(conn, query, params)

    async def load_needing_attention(
        self,
        statuses: Collection[SessionStatus],
        watched: Collection[SessionStatus],
        expiring_before: datetime | None,
    ) -> list[SessionWithKernels]:
        """Like `load`, but a session in `watched` only when something may have to be done.

        That is: a live kernel of it has a stage failure reported or is on an agent that is
        not ALIVE (or no longer known), or it entered its status before `expiring_before`
        (None: it never expires). See `LifecycleHandler.watched_session_statuses`.
        """
        acted = tuple(sorted(s.value for s in statuses if s not in watched))
        query = _attention_query(
            acted, tuple(sorted(s.value for s in watched)), timed=expiring_before is not None
        )
        params = {} if expiring_before is None else {"expiring_before": expiring_before}
        async with self.db.read() as conn:
            return await load_with_kernels(conn, query, params)

    async def get(self, session_ids: Collection[SessionId]) -> list[SessionWithKernels]:
        """The given sessions with their kernels (missing ids are left out)."""
        if not session_ids:
            return []
        async with self.db.read() as conn:
            return await load_with_kernels(
                conn, _by_ids_query(self.dialect), {"ids": payload(self.dialect, session_ids)}
            )

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
        query = _promotable_query(
            tuple(sorted(s.value for s in statuses)),
            tuple(sorted(k.value for k in kernel_statuses)),
            match,
        )
        async with self.db.read() as conn:
            return {SessionId(sid) for sid in (await conn.execute(query)).scalars()}

    async def apply(self, changes: Sequence[StatusChange], now: datetime) -> AppliedChanges:
        """Apply judged changes in one transaction: guarded moves, slot release, history."""
        return await apply_changes(self.db, changes, now)


def _session_row(s: NewSession, now: datetime) -> dict[str, Any]:
    return {
        "id": s.id,
        "name": s.name,
        "owner_id": s.owner_id,
        "project": s.project,
        "type": s.type,
        "priority": s.priority,
        "resource_group": s.resource_group,
        "cluster_mode": s.cluster_mode,
        "cluster_size": s.cluster_size,
        "spec": dict(s.spec),
        "status": SessionStatus.PENDING.value,
        "status_changed_at": now,
        "created_at": now,
        "creation_id": s.creation_id,
        "starts_at": s.starts_at,
        "phase_attempts": 0,
        "failed_agents": [],
        "requeue_count": 0,
        "requeue_active": True,
        "retry_count": 0,
        "max_retries": 0,
    }


def _kernel_rows(s: NewSession, now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "id": uuid.uuid4(),
            "session_id": s.id,
            "cluster_role": "main" if index == 0 else "sub",
            "cluster_index": index,
            "status": KernelStatus.PENDING.value,
            "status_changed_at": now,
            "created_at": now,
            "requested_slots": dict(s.kernel_slots),
            "runtime_info": {},
        }
        for index in range(s.cluster_size)
    ]


async def insert_sessions(
    conn: AsyncConnection, new_sessions: Sequence[NewSession], now: datetime
) -> list[dict[str, Any]]:
    """Create sessions, their PENDING kernels and dependencies, in the caller's transaction.

    Returns the session rows as written (column → value, unset columns left out), each with
    its kernel rows under `kernels`, in the order of `new_sessions`.
    """
    if not new_sessions:
        return []
    session_rows = [_session_row(s, now) for s in new_sessions]
    kernel_rows = [_kernel_rows(s, now) for s in new_sessions]
    await conn.execute(sessions.insert(), session_rows)
    await conn.execute(kernels.insert(), [row for rows in kernel_rows for row in rows])
    deps = [{"session_id": s.id, "depends_on": d} for s in new_sessions for d in s.dependencies]
    if deps:
        await conn.execute(session_dependencies.insert(), deps)
    return [row | {"kernels": rows} for row, rows in zip(session_rows, kernel_rows, strict=True)]


# The load query selects this many session columns, then the kernel's.
_SESSION_COLUMNS = 19


@functools.cache
def _promotable_query(
    statuses: tuple[str, ...], kernel_statuses: tuple[str, ...], match: KernelMatchType
) -> sa.Select[Any]:
    in_set = kernels.c.status.in_(kernel_statuses)
    kernel_of_session = kernels.c.session_id == sessions.c.id
    if match is KernelMatchType.ALL:
        condition = ~sa.exists().where(kernel_of_session, sa.not_(in_set))
    elif match is KernelMatchType.ANY:
        condition = sa.exists().where(kernel_of_session, in_set)
    else:
        condition = ~sa.exists().where(kernel_of_session, in_set)
    return sa.select(sessions.c.id).where(sessions.c.status.in_(statuses), condition)


@functools.cache
def _load_query(
    statuses: tuple[str, ...],
    kernel_statuses: tuple[str, ...] | None,
    *,
    by_group: bool,
    limited: bool,
) -> sa.Select[Any]:
    """`SessionRepository.load`'s statement, built once per shape (parameters: group, limit)."""
    query = sa.select(sessions.c.id).where(sessions.c.status.in_(statuses))
    if by_group:
        query = query.where(sessions.c.resource_group == sa.bindparam("group"))
    if kernel_statuses is not None:
        query = query.where(
            sa.exists().where(
                kernels.c.session_id == sessions.c.id, kernels.c.status.in_(kernel_statuses)
            )
        )
    if limited:
        query = query.order_by(sessions.c.created_at, sessions.c.id).limit(
            sa.bindparam("limit", type_=sa.Integer())
        )
    return with_kernels(sessions.c.id.in_(query.scalar_subquery()))


@functools.cache
def _attention_query(
    acted: tuple[str, ...], watched: tuple[str, ...], *, timed: bool
) -> sa.Select[Any]:
    """`load_needing_attention`'s statement, built once per shape (parameter: expiring_before)."""
    s, k = sessions.c, kernels.alias("watched_kernel").c  # the outer query joins `kernels`
    on_lost_agent = sa.and_(
        k.agent_id.is_not(None),
        ~sa.exists().where(agents.c.id == k.agent_id, agents.c.status == AGENT_ALIVE),
    )
    troubled: sa.ColumnElement[bool] = sa.exists().where(
        k.session_id == s.id,
        k.status.not_in([status.value for status in KERNEL_TERMINAL]),
        sa.or_(k.stage_failure.is_not(None), on_lost_agent),
    )
    if timed:
        expiring = s.status_changed_at < sa.bindparam(
            "expiring_before", type_=s.status_changed_at.type
        )
        troubled = sa.or_(troubled, expiring)
    return with_kernels(sa.or_(s.status.in_(acted), sa.and_(s.status.in_(watched), troubled)))


@functools.cache
def _by_ids_query(dialect: Dialect) -> sa.Select[Any]:
    return with_kernels(in_param(dialect, sessions.c.id, "ids"))


def with_kernels(where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The sessions matching `where` with every kernel of theirs, oldest session first."""
    s, k = sessions.c, kernels.c
    return (
        sa.select(
            s.id,
            s.name,
            s.owner_id,
            s.type,
            s.priority,
            s.resource_group,
            s.cluster_mode,
            s.cluster_size,
            s.status,
            s.status_info,
            s.status_changed_at,
            s.created_at,
            s.starts_at,
            s.requeue_at,
            s.requeue_active,
            s.phase,
            s.phase_attempts,
            sa.cast(s.failed_agents, sa.Text),
            s.creation_id,
            k.id,
            k.cluster_role,
            k.cluster_index,
            k.agent_id,
            k.status,
            k.status_changed_at,
            sa.cast(k.requested_slots, sa.Text),
            sa.cast(k.occupied_slots, sa.Text),
            k.exit_code,
            k.failure_cause,
            k.desired_state,
            k.desired_generation,
            k.stage_failure,
            s.started_at,
        )
        .select_from(sessions.join(kernels, k.session_id == s.id))
        .where(where)
        .order_by(s.created_at, s.id, k.cluster_index)
    )


async def load_with_kernels(
    conn: AsyncConnection, statement: sa.Select[Any], params: Mapping[str, Any]
) -> list[SessionWithKernels]:
    """Sessions with their kernels: the rows of a `with_kernels` statement, run with `params`."""
    rows = await conn.execute(statement, dict(params))
    # JSON comes back as text and is decoded once per distinct value: a batch repeats a few
    # request shapes thousands of times. The decoded values are shared: read-only.
    decoded: dict[str, Any] = {}

    def load_json(raw: str | None) -> Any:
        if raw is None:
            return None
        value = decoded.get(raw)
        if value is None:
            value = decoded[raw] = json.loads(raw)
        return value

    result: list[SessionWithKernels] = []
    pending_kernels: list[KernelRecord] = []
    head: tuple[Any, ...] | None = None
    for row in rows:
        if head is None or row[0] != head[0]:
            if head is not None:
                result.append(_session(head, pending_kernels, load_json))
            head, pending_kernels = (*row[:_SESSION_COLUMNS], row[32]), []
        pending_kernels.append(
            KernelRecord(
                id=KernelId(row[19]),
                session_id=SessionId(row[0]),
                cluster_role=row[20],
                cluster_index=row[21],
                agent_id=AgentId(row[22]) if row[22] is not None else None,
                status=KernelStatus(row[23]),
                status_changed_at=row[24],
                requested_slots=load_json(row[25]),
                occupied_slots=load_json(row[26]),
                exit_code=row[27],
                failure_cause=row[28],
                desired_state=KernelIntent(row[29]) if row[29] is not None else None,
                desired_generation=row[30],
                stage_failure=row[31],
            )
        )
    if head is not None:
        result.append(_session(head, pending_kernels, load_json))
    return result


def _session(
    head: tuple[Any, ...], kernel_records: list[KernelRecord], load_json: Callable[[Any], Any]
) -> SessionWithKernels:
    return SessionWithKernels(
        id=SessionId(head[0]),
        name=head[1],
        owner_id=UserId(head[2]),
        type=head[3],
        priority=head[4],
        resource_group=head[5],
        cluster_mode=head[6],
        cluster_size=head[7],
        status=SessionStatus(head[8]),
        status_info=head[9],
        status_changed_at=head[10],
        created_at=head[11],
        starts_at=head[12],
        requeue_at=head[13],
        requeue_active=head[14],
        phase=head[15],
        phase_attempts=head[16],
        failed_agents=tuple(AgentId(a) for a in load_json(head[17])),
        creation_id=head[18],
        kernels=tuple(kernel_records),
        started_at=head[19],
    )
