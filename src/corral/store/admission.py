"""The reads and writes behind all-or-nothing admission (spec document 2).

Reads: the admitted sessions of the enabled groups whose KernelsReady condition is false, and
the deactivated sessions of groups that keep them for a while. Writes: the requeue state of
evicted sessions (in the transaction that moves them back to PENDING) and a session's
activation. Only groups that enable `wait_for_kernels_ready` are ever read: with none, the
task behind them costs no statement.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId
from corral.store.tables import sessions

# The statuses of an admitted session: placed, not yet ended or stopping.
ADMITTED = (
    SessionStatus.SCHEDULED,
    SessionStatus.PREPARING,
    SessionStatus.PREPARED,
    SessionStatus.CREATING,
    SessionStatus.RUNNING,
)


@record
class NotReady:
    """An admitted session whose kernels are not all ready, with its requeue state."""

    id: SessionId
    group: str
    status: SessionStatus
    reason: str | None
    since: datetime
    requeue_count: int
    requeue_at: datetime | None
    first_evicted_at: datetime | None


@record
class Eviction:
    """What an evicted session's row becomes: requeued (count, time) or deactivated."""

    id: SessionId
    requeue_count: int
    requeue_at: datetime | None
    first_evicted_at: datetime | None
    active: bool
    reason: str


async def read_not_ready(conn: AsyncConnection, groups: Collection[str]) -> list[NotReady]:
    """The admitted sessions of `groups` whose KernelsReady condition is false."""
    if not groups:
        return []
    s = sessions.c
    rows = await conn.execute(
        sa.select(
            s.id,
            s.resource_group,
            s.status,
            s.kernels_ready_reason,
            s.kernels_ready_at,
            s.requeue_count,
            s.requeue_at,
            s.first_evicted_at,
        ).where(
            s.status.in_([status.value for status in ADMITTED]),
            s.resource_group.in_(sorted(groups)),
            s.kernels_ready.is_(False),
        )
    )
    return [
        NotReady(
            SessionId(row[0]),
            row[1],
            SessionStatus(row[2]),
            row[3],
            row[4],
            int(row[5]),
            row[6],
            row[7],
        )
        for row in rows
    ]


async def read_deactivated(
    conn: AsyncConnection, groups: Collection[str]
) -> list[tuple[SessionId, str, datetime]]:
    """The deactivated PENDING sessions of `groups`: id, group, when deactivated."""
    if not groups:
        return []
    s = sessions.c
    rows = await conn.execute(
        sa.select(s.id, s.resource_group, s.deactivated_at).where(
            s.status == SessionStatus.PENDING.value,
            s.resource_group.in_(sorted(groups)),
            s.requeue_active.is_(False),
            s.deactivated_at.is_not(None),
        )
    )
    return [(SessionId(sid), group, at) for sid, group, at in rows]


async def write_evictions(
    conn: AsyncConnection, evictions: Sequence[Eviction], now: datetime
) -> None:
    """The requeue state of evicted sessions (run in the transaction that moved them)."""
    if not evictions:
        return
    s = sessions.c
    statement = (
        sessions.update()
        .where(s.id == sa.bindparam("sid"))
        .values(
            requeue_count=sa.bindparam("count"),
            requeue_at=sa.bindparam("at", type_=s.requeue_at.type),
            first_evicted_at=sa.bindparam("first", type_=s.first_evicted_at.type),
            requeue_active=sa.bindparam("active"),
            evicted_at=sa.bindparam("now", type_=s.evicted_at.type),
            eviction_reason=sa.bindparam("reason"),
            deactivated_at=sa.bindparam("deactivated", type_=s.deactivated_at.type),
        )
    )
    params: list[dict[str, Any]] = [
        {
            "sid": e.id,
            "count": e.requeue_count,
            "at": e.requeue_at,
            "first": e.first_evicted_at,
            "active": e.active,
            "now": now,
            "reason": e.reason,
            "deactivated": None if e.active else now,
        }
        for e in evictions
    ]
    await conn.execute(statement, params)


async def activate(
    conn: AsyncConnection, session_id: SessionId
) -> tuple[SessionStatus, bool, UserId] | None:
    """Put a deactivated PENDING session back in the queue with a fresh requeue count.

    Returns its status, whether it was inactive (False: nothing to do) and its owner; None if
    there is no such session.
    """
    s = sessions.c
    row = (
        await conn.execute(
            sa.select(s.status, s.requeue_active, s.owner_id)
            .where(s.id == session_id)
            .with_for_update()
        )
    ).first()
    if row is None:
        return None
    status, active, owner = SessionStatus(row[0]), bool(row[1]), UserId(row[2])
    if active or status is not SessionStatus.PENDING:
        return status, False, owner
    await conn.execute(
        sessions.update()
        .where(s.id == session_id, s.status == SessionStatus.PENDING.value)
        .values(
            requeue_active=True,
            requeue_count=0,
            requeue_at=None,
            first_evicted_at=None,
            deactivated_at=None,
            status_info=None,
        )
    )
    return status, True, owner


async def read_admission_blocker(conn: AsyncConnection, group: str) -> tuple[SessionId, int] | None:
    """An admitted session of `group` whose kernels are not all ready (id, number), oldest
    admission first; None when every admitted session is ready."""
    s = sessions.c
    row = (
        await conn.execute(
            sa.select(s.id, s.number)
            .where(
                s.status.in_([status.value for status in ADMITTED]),
                s.resource_group == group,
                s.kernels_ready.is_(False),
            )
            .order_by(s.kernels_ready_at, s.id)
            .limit(1)
        )
    ).first()
    return None if row is None else (SessionId(row[0]), int(row[1]))
