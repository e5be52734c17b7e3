"""The manager's retention task: a run purges what expired, batch after batch; 0 days keeps all."""

from __future__ import annotations

from datetime import timedelta

from corral.infra.hints.memory import MemoryHintBus
from corral.infra.locks.memory import MemoryLockManager
from corral.manager.retention import retention_loop, retention_task
from corral.store.database import Database
from tests.integration.store._factories import NOW, add_session_ids, add_user, update_sessions


async def test_a_run_purges_every_expired_session_in_batches(db: Database) -> None:
    """Sessions ended 31 days ago go, in batches of the given size; the one ended today stays."""
    owner = await add_user(db)
    *expired, today = await add_session_ids(db, owner, 6)
    await update_sessions(db, expired, status="TERMINATED", terminated_at=NOW - timedelta(31))
    await update_sessions(db, [today], status="TERMINATED", terminated_at=NOW)
    task = retention_task(db, 30, lambda: NOW, lock="test:purge", batch=2)
    run = await task.run()
    assert (run.task, run.changed) == ("PurgeExpiredSessions", 5)
    assert (await task.run()).changed == 0


def test_no_loop_when_sessions_are_kept_for_ever(db: Database) -> None:
    """`retention_days = 0` runs no retention task at all."""
    hints, locks = MemoryHintBus(prefix="test"), MemoryLockManager(prefix="test")
    kept = retention_loop(
        db, hints, locks, retention_days=0, clock=lambda: NOW, prefix="t", every_s=60
    )
    assert kept is None
    assert retention_loop(
        db, hints, locks, retention_days=30, clock=lambda: NOW, prefix="t", every_s=60
    )
