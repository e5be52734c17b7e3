"""The retention task: ended sessions older than the retention period are deleted, batch by
batch, and then the uploads no session names any more once unused for their bound.

A dual loop of its own, forced every long interval and holding its lock while it runs, so of
several managers one purges at a time. A run deletes batches (one transaction each) until
none is left or `MAX_BATCHES_PER_RUN` were deleted: a backlog, say after the period was
shortened, is worked off over several runs without holding the writer for long.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from corral.coordination.loop import DualLoop
from corral.coordination.tasks import Task, TaskRun
from corral.domain.types import Clock
from corral.infra.hints import HintBus
from corral.infra.locks import LockManager
from corral.store.database import Database
from corral.store.retention import PURGE_BATCH, purge_expired_sessions
from corral.store.uploads import (
    DEFAULT_UNUSED_UPLOAD_HOURS,
    PURGE_UPLOADS_BATCH,
    purge_unused_uploads,
)

logger = logging.getLogger(__name__)

RETENTION_TASK = "PurgeExpiredSessions"
RETENTION_HINT = "sessions-purge"
MAX_BATCHES_PER_RUN = 20


def retention_task(
    db: Database,
    retention_days: float,
    clock: Clock,
    *,
    lock: str,
    unused_upload_hours: float = DEFAULT_UNUSED_UPLOAD_HOURS,
    batch: int = PURGE_BATCH,
) -> Task:
    """The task that deletes sessions ended more than `retention_days` ago (0: none), then
    uploads no session names that were unused for `unused_upload_hours` (0: none)."""

    async def purge() -> TaskRun:
        started = time.perf_counter()
        now = clock()
        purged = uploads = 0
        if retention_days > 0:
            before = now - timedelta(days=retention_days)
            for _ in range(MAX_BATCHES_PER_RUN):
                ids = await purge_expired_sessions(db, before, batch=batch)
                purged += len(ids)
                if len(ids) < batch:
                    break
            if purged:
                logger.info("sessions.purged", extra={"sessions": purged, "ended_before": before})
        if unused_upload_hours > 0:
            unused_since = now - timedelta(hours=unused_upload_hours)
            for _ in range(MAX_BATCHES_PER_RUN):
                deleted = await purge_unused_uploads(db, unused_since, batch=PURGE_UPLOADS_BATCH)
                uploads += deleted
                if deleted < PURGE_UPLOADS_BATCH:
                    break
            if uploads:
                logger.info(
                    "uploads.purged", extra={"uploads": uploads, "unused_since": unused_since}
                )
        return TaskRun(
            RETENTION_TASK,
            targets=purged + uploads,
            changed=purged + uploads,
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    return Task(RETENTION_TASK, RETENTION_HINT, purge, lock=lock)


def retention_loop(
    db: Database,
    hints: HintBus,
    locks: LockManager,
    *,
    retention_days: float,
    unused_upload_hours: float = DEFAULT_UNUSED_UPLOAD_HOURS,
    clock: Clock,
    prefix: str,
    every_s: float,
) -> DualLoop | None:
    """The retention task's loop, run every `every_s`; None when everything is kept for ever."""
    if retention_days <= 0 and unused_upload_hours <= 0:
        return None
    task = retention_task(
        db,
        retention_days,
        clock,
        lock=f"{prefix}:{RETENTION_TASK}",
        unused_upload_hours=unused_upload_hours,
    )
    return DualLoop(task, hints, locks, short_interval_s=every_s, long_interval_s=every_s)
