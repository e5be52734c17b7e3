"""Running a promotion handler: find its targets, match their kernels, promote, in batches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.handlers.base import Ending, SessionPromotionHandler
from corral.store.database import Database
from corral.store.sessions import SessionRepository
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes
from corral.store.tables import sessions

OnApplied = Callable[[AsyncConnection, AppliedChanges], Awaitable[None]]


async def run_promotion(
    db: Database,
    handler: SessionPromotionHandler,
    now: datetime,
    *,
    on_applied: OnApplied | None = None,
) -> AppliedChanges:
    """Promote every session of the handler's targets whose kernels meet its condition.

    Two steps whatever the number of sessions: one query for the targets whose kernels match,
    and the guarded promotion (with history); a session that moved meanwhile is left alone. A
    handler with endings (PromoteToTerminated) also reads the promoted sessions' kernels, to
    end each in its own terminal status with its result and exit code.
    """
    repository = SessionRepository(db)
    promoted = await repository.promotable(
        handler.target_session_statuses, handler.check_kernel_statuses, handler.match_type
    )
    if not promoted:
        return AppliedChanges()
    endings = handler.endings(await repository.get(promoted)) if _has_endings(handler) else {}
    by_status: dict[SessionStatus, list[SessionId]] = {}
    for sid in sorted(promoted):
        ending = endings.get(sid)
        status = ending.status if ending is not None else handler.success_session_status()
        by_status.setdefault(status, []).append(sid)
    changes = [
        StatusChange(
            ids,
            handler.name(),
            SchedulingResult.SUCCESS,
            handler.target_session_statuses,
            TransitionStatus(status),
            notes={sid: note for sid in ids if (note := _note(endings, sid)) is not None},
        )
        for status, ids in by_status.items()
    ]

    async def finish(conn: AsyncConnection, applied: AppliedChanges) -> None:
        await _write_endings(conn, endings, applied)
        if on_applied is not None:
            await on_applied(conn, applied)

    return await apply_changes(db, changes, now, on_applied=finish)


def _has_endings(handler: SessionPromotionHandler) -> bool:
    return type(handler).endings is not SessionPromotionHandler.endings


def _note(endings: Mapping[SessionId, Ending], sid: SessionId) -> ResultNote | None:
    ending = endings.get(sid)
    return ending.note if ending is not None else None


async def _write_endings(
    conn: AsyncConnection, endings: Mapping[SessionId, Ending], applied: AppliedChanges
) -> None:
    """Result and exit code of the sessions that ended (those that passed their guard)."""
    rows = [
        {"sid": sid, "res": endings[sid].result, "code": endings[sid].exit_code}
        for sid in applied.sessions
        if sid in endings
    ]
    if rows:
        await conn.execute(
            sessions.update()
            .where(sessions.c.id == sa.bindparam("sid"))
            .values(result=sa.bindparam("res"), exit_code=sa.bindparam("code")),
            rows,
        )
