"""Running a promotion handler: find its targets, match their kernels, promote, in batches."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.types import SessionId
from corral.handlers.base import SessionPromotionHandler
from corral.store.database import Database
from corral.store.sessions import SessionRepository
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes
from corral.store.tables import sessions


async def run_promotion(
    db: Database, handler: SessionPromotionHandler, now: datetime
) -> AppliedChanges:
    """Promote every session of the handler's targets whose kernels meet its condition.

    Three statements whatever the number of sessions: the targets' ids, the kernel match, and
    the guarded promotion (with history); a session that moved meanwhile is left alone.
    """
    async with db.read() as conn:
        targets = [
            SessionId(sid)
            for sid in (
                await conn.execute(
                    sa.select(sessions.c.id).where(
                        sessions.c.status.in_([s.value for s in handler.target_session_statuses])
                    )
                )
            ).scalars()
        ]
    if not targets:
        return AppliedChanges()
    promoted = await SessionRepository(db).match_kernels(
        targets, handler.check_kernel_statuses, handler.match_type
    )
    if not promoted:
        return AppliedChanges()
    change = StatusChange(
        sorted(promoted),
        handler.name(),
        SchedulingResult.SUCCESS,
        handler.target_session_statuses,
        TransitionStatus(handler.success_session_status()),
    )
    return await apply_changes(db, [change], now)
