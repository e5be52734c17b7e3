"""The manager's retention task: a run purges what expired, batch after batch (sessions, then
uploads no session names); 0 keeps all."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from corral.infra.hints.memory import MemoryHintBus
from corral.infra.locks.memory import MemoryLockManager
from corral.manager.retention import retention_loop, retention_task
from corral.store.database import Database
from corral.store.tables import uploads
from corral.store.uploads import store_upload, touch_upload
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
    """`retention_days = 0` with `unused_upload_hours = 0` runs no retention task at all."""
    hints, locks = MemoryHintBus(prefix="test"), MemoryLockManager(prefix="test")
    kept = retention_loop(
        db,
        hints,
        locks,
        retention_days=0,
        unused_upload_hours=0,
        clock=lambda: NOW,
        prefix="t",
        every_s=60,
    )
    assert kept is None
    assert retention_loop(
        db, hints, locks, retention_days=30, clock=lambda: NOW, prefix="t", every_s=60
    )


async def test_uploads_go_once_no_kept_session_names_them_and_their_bound_passed(
    db: Database,
) -> None:
    """An upload stays while a session names it and for `unused_upload_hours` after its last
    use; the run after its last session was purged deletes it, and a fresh one stays."""
    owner = await add_user(db)
    old, fresh, named = (f"{n}" * 64 for n in "abc")
    for digest in (old, named):
        await store_upload(db, owner, digest, b"\x1f\x8b old", NOW - timedelta(days=40))
    await store_upload(db, owner, fresh, b"\x1f\x8b fresh", NOW - timedelta(hours=1))
    (session,) = await add_session_ids(db, owner, 1)
    await update_sessions(db, [session], upload=named)
    task = retention_task(db, 30, lambda: NOW, lock="test:purge", unused_upload_hours=24)

    assert (await task.run()).changed == 1  # `old`: named by nothing, unused for 40 days
    assert await _digests(db) == {fresh, named}
    await update_sessions(db, [session], status="TERMINATED", terminated_at=NOW - timedelta(31))
    assert (await task.run()).changed == 2  # the session, then the upload it named
    assert await _digests(db) == {fresh}
    assert await touch_upload(db, owner, fresh, NOW) is not None
    later = retention_task(
        db, 30, lambda: NOW + timedelta(hours=23), lock="test:purge", unused_upload_hours=24
    )
    assert (await later.run()).changed == 0  # asked for an hour ago: kept a day from then


async def _digests(db: Database) -> set[str]:
    async with db.read() as conn:
        return set((await conn.execute(sa.select(uploads.c.digest))).scalars())
