"""Forgetting ended sessions after the retention period: the session, its logs, history, events.

The manager's `PurgeExpiredSessions` task calls `purge_expired_sessions` on its long loop,
under its lock; each call deletes one batch in one transaction, so a large backlog is worked
off in short transactions that never hold the writer for long.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from corral.domain.status import SESSION_TERMINAL
from corral.domain.types import SessionId
from corral.store.database import Database
from corral.store.session_removal import remove_sessions
from corral.store.tables import routes, session_dependencies, sessions

DEFAULT_RETENTION_DAYS = 30.0  # a manager setting; 0 keeps ended sessions for ever
PURGE_BATCH = 500  # sessions deleted per transaction


async def purge_expired_sessions(
    db: Database, ended_before: datetime, *, batch: int = PURGE_BATCH
) -> list[SessionId]:
    """Delete up to `batch` sessions that ended before `ended_before`, with their kernels,
    logs, outputs, history, dependencies and events; the ids deleted.

    A session that a session still to run depends on, or that a route serves, is kept.
    """
    ended = [s.value for s in SESSION_TERMINAL]
    dependant = sa.alias(sessions, "dependant")
    async with db.transaction() as conn:
        waited_on = (
            sa.select(session_dependencies.c.depends_on)
            .join(dependant, dependant.c.id == session_dependencies.c.session_id)
            .where(
                session_dependencies.c.depends_on == sessions.c.id,
                dependant.c.status.not_in(ended),
            )
        )
        served = sa.select(routes.c.id).where(routes.c.session_id == sessions.c.id)
        rows = await conn.execute(
            sa.select(sessions.c.id)
            .where(
                sessions.c.status.in_(ended),
                sessions.c.terminated_at < ended_before,
                ~waited_on.exists(),
                ~served.exists(),
            )
            .limit(batch)
        )
        ids = [SessionId(sid) for (sid,) in rows]
        if not ids:
            return []
        await remove_sessions(conn, db.dialect, ids, with_events=True)
    return ids
