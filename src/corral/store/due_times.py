"""When sessions next come due without anything happening: a phase timeout, a start time.

Read by the coordinator after a lifecycle run (at most once a second per task, see
`coordination.due`), so the task's loop can wake at that moment instead of at its long loop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.status import SessionStatus
from corral.store.tables import sessions


async def next_phase_expiry(
    conn: AsyncConnection,
    statuses: Collection[SessionStatus],
    timeouts: Mapping[str, float],
    default_timeout_s: float | None,
    now: datetime,
) -> datetime | None:
    """The earliest moment after `now` at which a session in `statuses` exceeds its group's
    timeout (`timeouts` per resource group that overrides the default; None: never)."""
    s = sessions.c

    def not_expired(timeout_s: float) -> sa.ColumnElement[bool]:
        return s.status_changed_at > now - timedelta(seconds=timeout_s)

    timed = [
        sa.and_(s.resource_group == group, not_expired(timeout_s))
        for group, timeout_s in timeouts.items()
    ]
    if default_timeout_s is not None:
        others = s.resource_group.not_in(list(timeouts)) if timeouts else sa.true()
        timed.append(sa.and_(others, not_expired(default_timeout_s)))
    if not timed:
        return None
    query = (
        sa.select(s.resource_group, sa.func.min(s.status_changed_at))
        .where(s.status.in_([status.value for status in statuses]), sa.or_(*timed))
        .group_by(s.resource_group)
    )
    earliest: datetime | None = None
    for group, entered in await conn.execute(query):
        timeout_s = timeouts.get(group, default_timeout_s)
        if entered is None or timeout_s is None:
            continue
        due = entered + timedelta(seconds=timeout_s)
        if earliest is None or due < earliest:
            earliest = due
    return earliest


async def next_placeable(conn: AsyncConnection, now: datetime) -> datetime | None:
    """The earliest moment after `now` at which a PENDING session becomes placeable: its
    `starts_at` or `requeue_at`, whichever is later."""
    s = sessions.c
    placeable_at = sa.case(
        (s.starts_at.is_(None), s.requeue_at),
        (s.requeue_at.is_(None), s.starts_at),
        (s.starts_at > s.requeue_at, s.starts_at),
        else_=s.requeue_at,
    )
    query = sa.select(sa.func.min(placeable_at)).where(
        s.status == SessionStatus.PENDING.value,
        s.requeue_active.is_(True),
        placeable_at > now,
    )
    due: datetime | None = (await conn.execute(query)).scalar()
    return due
