"""Sessions and kernels: creation, the handlers' target queries, and guarded status changes.

Every query here works on a batch: one statement for all sessions of a phase, never one per
session. Every status write is guarded by the expected current status and checked against the
domain's transition table before anything is sent to the database.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.results import KernelMatchType, ResultNote, SchedulingResult, TransitionStatus
from corral.domain.session import KernelRecord, NewSession, SessionWithKernels
from corral.domain.status import (
    KERNEL_TERMINAL,
    KERNEL_TRANSITIONS,
    SESSION_TERMINAL,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import AgentId, KernelId, SessionId, UserId
from corral.store._sql import IdBatch, id_batch, in_values
from corral.store.agents import apply_slot_deltas
from corral.store.database import Database, Dialect
from corral.store.history import record_kernel_history, record_session_history
from corral.store.tables import kernels, session_dependencies, sessions

# Results after which the agents that held the session count as having failed it.
_FAILED_RESULTS = frozenset({SchedulingResult.EXPIRED, SchedulingResult.GIVE_UP})


@dataclass(frozen=True, slots=True)
class StatusChange:
    """One judged outcome for a batch of sessions: a guarded move plus its history.

    Only sessions whose current status is in `expected` are touched (the guard); the rest were
    moved by someone else and are reported back as stale. With `target` None (or both of its
    fields None) only history is written. `count_attempt` adds one to the sessions' attempts in
    `phase` (failed attempts that keep their status).
    """

    session_ids: Sequence[SessionId]
    phase: str
    result: SchedulingResult
    expected: frozenset[SessionStatus]
    target: TransitionStatus | None = None
    notes: Mapping[SessionId, ResultNote] = field(default_factory=dict)
    count_attempt: bool = False

    def validate(self) -> None:
        """Raise IllegalTransitionError if the declared move breaks the session table."""
        if self.target is not None and self.target.session is not None:
            SESSION_TRANSITIONS.check(self.expected - {self.target.session}, self.target.session)


@dataclass(slots=True)
class AppliedChanges:
    """What an `apply` actually did."""

    # session id → (status before, status after), for every session that passed its guard
    sessions: dict[SessionId, tuple[SessionStatus, SessionStatus]] = field(default_factory=dict)
    # how many kernels changed status
    kernels_moved: int = 0
    # sessions named in a change whose guard failed (moved concurrently)
    stale: set[SessionId] = field(default_factory=set)

    def moved(self) -> dict[SessionId, tuple[SessionStatus, SessionStatus]]:
        """Only the sessions whose status changed."""
        return {sid: move for sid, move in self.sessions.items() if move[0] != move[1]}


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
            await conn.execute(sessions.insert(), [_session_row(s, now) for s in new_sessions])
            await conn.execute(
                kernels.insert(), [row for s in new_sessions for row in _kernel_rows(s, now)]
            )
            deps = [
                {"session_id": s.id, "depends_on": dep}
                for s in new_sessions
                for dep in s.dependencies
            ]
            if deps:
                await conn.execute(session_dependencies.insert(), deps)

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
        query = sa.select(sessions.c.id).where(sessions.c.status.in_([s.value for s in statuses]))
        if resource_group is not None:
            query = query.where(sessions.c.resource_group == resource_group)
        if kernel_statuses is not None:
            query = query.where(
                sa.exists().where(
                    kernels.c.session_id == sessions.c.id,
                    kernels.c.status.in_([k.value for k in kernel_statuses]),
                )
            )
        if limit is not None:
            query = query.order_by(sessions.c.created_at, sessions.c.id).limit(limit)
        async with self.db.read() as conn:
            return await load_with_kernels(conn, sessions.c.id.in_(query.scalar_subquery()))

    async def get(self, session_ids: Collection[SessionId]) -> list[SessionWithKernels]:
        """The given sessions with their kernels (missing ids are left out)."""
        if not session_ids:
            return []
        async with self.db.read() as conn:
            return await load_with_kernels(
                conn, in_values(self.dialect, sessions.c.id, session_ids)
            )

    async def match_kernels(
        self,
        session_ids: Collection[SessionId],
        statuses: Collection[KernelStatus],
        match: KernelMatchType,
    ) -> set[SessionId]:
        """The sessions among `session_ids` whose kernels meet `match` against `statuses`.

        One query each, as in spec document 1: ALL looks for kernels outside the set, ANY and
        NOT_ANY for kernels inside it; the answer is the complement or the hits.
        """
        if not session_ids:
            return set()
        values = [s.value for s in statuses]
        in_set = kernels.c.status.in_(values)
        condition = sa.not_(in_set) if match is KernelMatchType.ALL else in_set
        async with self.db.read() as conn:
            rows = await conn.execute(
                sa.select(kernels.c.session_id)
                .distinct()
                .where(in_values(self.dialect, kernels.c.session_id, session_ids), condition)
            )
            hits = {SessionId(row[0]) for row in rows}
        if match is KernelMatchType.ANY:
            return hits
        return set(session_ids) - hits

    async def apply(self, changes: Sequence[StatusChange], now: datetime) -> AppliedChanges:
        """Apply judged changes in one transaction: guarded moves, slot release, history."""
        for change in changes:
            change.validate()
        applied = AppliedChanges()
        async with self.db.transaction() as conn:
            for change in changes:
                await self._apply_one(conn, change, now, applied)
        return applied

    async def _apply_one(
        self, conn: AsyncConnection, change: StatusChange, now: datetime, applied: AppliedChanges
    ) -> None:
        ids = list(dict.fromkeys(change.session_ids))
        if not ids:
            return
        current = await lock_sessions(conn, self.dialect, ids, change.expected)
        applied.stale.update(sid for sid in ids if sid not in current)
        if not current:
            return

        target = change.target or TransitionStatus()
        after = {sid: target.session or status for sid, status in current.items()}
        moving_list = [sid for sid, status in current.items() if after[sid] != status]
        staying_list = [sid for sid, status in current.items() if after[sid] == status]
        # Encoded once, shared by every statement below.
        passed = id_batch(self.dialect, current)
        moving = passed if len(moving_list) == len(passed) else id_batch(self.dialect, moving_list)
        staying = id_batch(self.dialect, staying_list)
        to_status = target.session.value if target.session is not None else None
        # History first: it reads the statuses being left straight from the rows.
        for group, group_moves in ((moving, True), (staying, False)):
            await record_session_history(
                conn,
                self.dialect,
                group,
                phase=change.phase,
                result=change.result.value,
                to_status=to_status,
                now=now,
                moving=group_moves,
                notes=change.notes,
            )
        if target.kernel is not None:
            applied.kernels_moved += await self._move_kernels(
                conn, passed, target.kernel, change, now
            )
        if target.session is not None and moving:
            await conn.execute(
                sessions.update()
                .where(in_values(self.dialect, sessions.c.id, moving))
                .values(**_session_move_values(target.session, now))
            )
        if change.count_attempt and staying:
            await conn.execute(
                sessions.update()
                .where(in_values(self.dialect, sessions.c.id, staying))
                .values(
                    phase=change.phase,
                    phase_attempts=sa.case(
                        (sessions.c.phase == change.phase, sessions.c.phase_attempts + 1),
                        else_=1,
                    ),
                )
            )
        await self._write_notes(conn, change, current, target)
        for sid, status in current.items():
            applied.sessions[sid] = (status, after[sid])

    async def _write_notes(
        self,
        conn: AsyncConnection,
        change: StatusChange,
        current: Mapping[SessionId, SessionStatus],
        target: TransitionStatus,
    ) -> None:
        noted = [sid for sid in current if sid in change.notes]
        if not noted:
            return
        records_cause = target.session in SESSION_TERMINAL
        await conn.execute(
            sessions.update()
            .where(sessions.c.id == sa.bindparam("sid"))
            .values(
                status_info=sa.bindparam("info"),
                failure_cause=sa.bindparam("cause") if records_cause else sessions.c.failure_cause,
            ),
            [
                {
                    "sid": sid,
                    "info": change.notes[sid].message[:512],
                    "cause": change.notes[sid].code,
                }
                for sid in noted
            ],
        )

    async def _move_kernels(
        self,
        conn: AsyncConnection,
        session_ids: IdBatch,
        to: KernelStatus,
        change: StatusChange,
        now: datetime,
    ) -> int:
        """Move the sessions' kernels to `to`; return how many moved.

        Only kernels whose status may legally move to `to` are touched: a kernel that already
        ended (or already is there) keeps its status. The session rows are locked already, and
        every writer locks sessions before their kernels, so kernel locks cannot deadlock.
        """
        sources = [s.value for s in KERNEL_TRANSITIONS.sources(to)]
        scope = sa.and_(
            in_values(self.dialect, kernels.c.session_id, session_ids),
            kernels.c.status.in_(sources),
        )
        await record_kernel_history(
            conn,
            self.dialect,
            session_ids,
            sources,
            phase=change.phase,
            result=change.result.value,
            to_status=to.value,
            now=now,
        )
        gives_back = to is KernelStatus.PENDING or to in KERNEL_TERMINAL
        held = await self._held_slots(conn, scope) if gives_back else {}
        if to is KernelStatus.PENDING and change.result in _FAILED_RESULTS:
            await self._remember_failed_agents(conn, scope)
        values: dict[str, Any] = {"status": to.value, "status_changed_at": now}
        if gives_back:
            values["occupied_slots"] = sa.null()
        if to is KernelStatus.PENDING:
            values["agent_id"] = None
        moved = await conn.execute(kernels.update().where(scope).values(**values))
        await apply_slot_deltas(conn, held)
        return int(moved.rowcount)

    async def _held_slots(
        self, conn: AsyncConnection, scope: sa.ColumnElement[bool]
    ) -> dict[AgentId, dict[str, int]]:
        """Negative deltas giving back what the kernels in `scope` occupy, summed in SQL."""
        each_fn = sa.func.jsonb_each_text if self.dialect == "postgresql" else sa.func.json_each
        each = each_fn(kernels.c.occupied_slots).table_valued("key", "value")
        rows = await conn.execute(
            sa.select(
                kernels.c.agent_id, each.c.key, sa.func.sum(sa.cast(each.c.value, sa.BigInteger))
            )
            .select_from(kernels.join(each, sa.true()))
            .where(scope, kernels.c.agent_id.is_not(None), kernels.c.occupied_slots.is_not(None))
            .group_by(kernels.c.agent_id, each.c.key)
        )
        deltas: dict[AgentId, dict[str, int]] = {}
        for agent_id, slot, amount in rows:
            deltas.setdefault(AgentId(agent_id), {})[slot] = -int(amount)
        return deltas

    async def _remember_failed_agents(
        self, conn: AsyncConnection, scope: sa.ColumnElement[bool]
    ) -> None:
        """Add the agents holding the kernels in `scope` to their sessions' failed agents."""
        rows = await conn.execute(
            sa.select(kernels.c.session_id, kernels.c.agent_id).where(
                scope, kernels.c.agent_id.is_not(None)
            )
        )
        holders: dict[SessionId, list[str]] = {}
        for sid, agent_id in rows:
            holders.setdefault(SessionId(sid), []).append(agent_id)
        if not holders:
            return
        known = await conn.execute(
            sa.select(sessions.c.id, sessions.c.failed_agents).where(
                in_values(self.dialect, sessions.c.id, holders)
            )
        )
        updates = []
        for sid, failed in known:
            merged = list(dict.fromkeys([*failed, *holders[SessionId(sid)]]))
            updates.append({"sid": sid, "failed": merged})
        await conn.execute(
            sessions.update()
            .where(sessions.c.id == sa.bindparam("sid"))
            .values(failed_agents=sa.bindparam("failed", type_=sessions.c.failed_agents.type)),
            updates,
        )


def _session_move_values(to: SessionStatus, now: datetime) -> dict[str, Any]:
    values: dict[str, Any] = {
        "status": to.value,
        "status_changed_at": now,
        "phase": None,
        "phase_attempts": 0,
    }
    if to is SessionStatus.RUNNING:
        values["started_at"] = now
    if to in SESSION_TERMINAL:
        values["terminated_at"] = now
    return values


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


async def lock_sessions(
    conn: AsyncConnection,
    dialect: Dialect,
    ids: Collection[SessionId],
    statuses: Collection[SessionStatus],
) -> dict[SessionId, SessionStatus]:
    """The sessions among `ids` whose status is one of `statuses`, locked for this transaction.

    PostgreSQL locks them (FOR UPDATE, in id order, so concurrent writers cannot deadlock).
    SQLite writers are serialised by BEGIN IMMEDIATE; there the status is checked here rather
    than in SQL, because without statistics SQLite would pick the status index and scan every
    session in that status to find a small batch.
    """
    allowed = {s.value for s in statuses}
    query = sa.select(sessions.c.id, sessions.c.status).where(
        in_values(dialect, sessions.c.id, ids)
    )
    if dialect == "postgresql":
        query = query.where(sessions.c.status.in_(allowed)).order_by(sessions.c.id)
    rows = await conn.execute(query.with_for_update())
    return {SessionId(sid): SessionStatus(status) for sid, status in rows if status in allowed}


# The load query selects this many session columns, then the kernel's.
_SESSION_COLUMNS = 19


async def load_with_kernels(
    conn: AsyncConnection, where: sa.ColumnElement[bool]
) -> list[SessionWithKernels]:
    s, k = sessions.c, kernels.c
    rows = await conn.execute(
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
        )
        .select_from(sessions.join(kernels, k.session_id == s.id))
        .where(where)
        .order_by(s.created_at, s.id, k.cluster_index)
    )
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
            head, pending_kernels = tuple(row[:_SESSION_COLUMNS]), []
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
    )
