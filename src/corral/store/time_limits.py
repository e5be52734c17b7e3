"""The reads behind wall-time limits: running sessions past their deadline, and the next one.

Both go through `ix_sessions_deadline_at`, which holds only running sessions with a limit
(`deadline_at` is set by the move to RUNNING and cleared by the move out of it), so they cost
the due sessions, not the sessions in the store.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.types import SessionId
from corral.store._direct import DirectStatement
from corral.store.tables import sessions

_NOW = sa.bindparam("now", type_=sessions.c.deadline_at.type)

# Oldest deadline first (parameters: now, limit).
_DUE = DirectStatement(
    lambda _dialect: (
        sa.select(sessions.c.id, sessions.c.time_limit_s)
        .where(sessions.c.deadline_at.is_not(None), sessions.c.deadline_at <= _NOW)
        .order_by(sessions.c.deadline_at)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )
)
# The first deadline still to come (parameter: now).
_NEXT = DirectStatement(
    lambda _dialect: sa.select(sa.func.min(sessions.c.deadline_at)).where(
        sessions.c.deadline_at.is_not(None), sessions.c.deadline_at > _NOW
    )
)


async def read_due(conn: AsyncConnection, now: datetime, limit: int) -> list[tuple[SessionId, int]]:
    """Up to `limit` running sessions whose deadline has come, with their limits (seconds)."""
    rows = await _DUE.rows(conn, {"now": now, "limit": limit})
    return [(SessionId(sid), int(limit_s)) for sid, limit_s in rows]


async def read_next_deadline(conn: AsyncConnection, now: datetime) -> datetime | None:
    """The earliest deadline after `now` of a running session (None: no limit is running)."""
    found = await _NEXT.scalars(conn, {"now": now})  # min() keeps the column's type
    value: datetime | None = found[0] if found else None
    return value
