"""The retention task: ended sessions older than the retention period are deleted, batch by batch.

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

logger = logging.getLogger(__name__)

RETENTION_TASK = "PurgeExpiredSessions"
RETENTION_HINT = "sessions-purge"
MAX_BATCHES_PER_RUN = 20


def retention_task(
    db: Database, retention_days: float, clock: Clock, *, lock: str, batch: int = PURGE_BATCH
) -> Task:
    """The task that deletes sessions ended more than `retention_days` ago."""

    async def purge() -> TaskRun:
        started = time.perf_counter()
        before = clock() - timedelta(days=retention_days)
        purged = 0
        for _ in range(MAX_BATCHES_PER_RUN):
            ids = await purge_expired_sessions(db, before, batch=batch)
            purged += len(ids)
            if len(ids) < batch:
                break
        if purged:
            logger.info("sessions.purged", extra={"sessions": purged, "ended_before": before})
        return TaskRun(
            RETENTION_TASK,
            targets=purged,
            changed=purged,
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    return Task(RETENTION_TASK, RETENTION_HINT, purge, lock=lock)


def retention_loop(
    db: Database,
    hints: HintBus,
    locks: LockManager,
    *,
    retention_days: float,
    clock: Clock,
    prefix: str,
    every_s: float,
) -> DualLoop | None:
    """The retention task's loop, run every `every_s`; None when sessions are kept for ever."""
    if retention_days <= 0:
        return None
    task = retention_task(db, retention_days, clock, lock=f"{prefix}:{RETENTION_TASK}")
    return DualLoop(task, hints, locks, short_interval_s=every_s, long_interval_s=every_s)
