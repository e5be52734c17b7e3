"""SQLite calls run on the event loop's thread; only a wait for another process's lock does not."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.store._inline_sqlite import STATEMENT_CACHE
from corral.store.database import Database
from corral.store.migrate import upgrade
from corral.store.tables import users


async def test_statements_run_on_the_event_loop_thread(tmp_path: Path) -> None:
    db = Database.open(f"sqlite:///{tmp_path / 'inline.db'}")
    try:
        async with db.read() as conn:
            raw = await conn.get_raw_connection()
            await raw.driver_connection.create_function("thread_id", 0, threading.get_ident)  # type: ignore[union-attr]
            ran_on = await conn.scalar(sa.text("SELECT thread_id()"))
        assert ran_on == threading.get_ident()
    finally:
        await db.close()


async def test_a_connection_keeps_every_statement_a_manager_runs_prepared(tmp_path: Path) -> None:
    """More distinct statements than sqlite3's default cache (128) stay prepared."""
    db = Database.open(f"sqlite:///{tmp_path / 'cache.db'}")
    try:
        async with db.read() as conn:
            try:
                await conn.exec_driver_sql("SELECT count(*) FROM sqlite_stmt")
            except sa.exc.OperationalError:
                pytest.skip("this SQLite has no sqlite_stmt table to count statements with")
            for n in range(STATEMENT_CACHE // 4):
                await conn.exec_driver_sql(f"SELECT {n}")
            prepared = await conn.scalar(sa.text("SELECT count(*) FROM sqlite_stmt"))
        assert prepared is not None and prepared > STATEMENT_CACHE // 4 > 128
    finally:
        await db.close()


@asynccontextmanager
async def _beside_another_writer(
    path: Path, *, pool_size: int = 10
) -> AsyncIterator[tuple[Database, sqlite3.Connection]]:
    """A migrated database at `path`, and a plain sqlite3 connection to it: another process's
    writer, in effect. Both are closed on exit."""
    db = Database.open(f"sqlite:///{path}", pool_size=pool_size)
    await upgrade(db)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        yield db, other
    finally:
        other.close()
        await db.close()


async def test_waiting_for_another_writer_does_not_block_the_event_loop(tmp_path: Path) -> None:
    async with _beside_another_writer(tmp_path / "locked.db") as (db, other):
        other.execute("BEGIN IMMEDIATE")
        ticking = asyncio.Event()

        async def tick() -> None:
            for _ in range(20):
                await asyncio.sleep(0.001)
            ticking.set()

        ticker = asyncio.create_task(tick())
        writer = asyncio.create_task(_delete_users(db))
        try:
            # The loop keeps running other tasks while the writer waits for the lock.
            async with asyncio.timeout(10):
                await ticking.wait()
            assert not writer.done(), "the writer must still be waiting for the other lock"
            other.execute("COMMIT")
            async with asyncio.timeout(10):
                await writer
        finally:
            ticker.cancel()
            writer.cancel()


async def test_a_contended_writer_retries_on_the_loop_thread_until_the_lock_frees(
    tmp_path: Path,
) -> None:
    """Every BEGIN IMMEDIATE runs on the loop's thread; one that finds another process's lock
    is tried again (the writer waits, it does not fail) and goes through once the lock frees."""
    async with _beside_another_writer(tmp_path / "begin.db", pool_size=1) as (db, other):
        tries = await _BeginTries.watch(db)
        await _delete_users(db)
        assert tries.threads == [threading.get_ident()]

        other.execute("BEGIN IMMEDIATE")
        writer = asyncio.create_task(_delete_users(db))
        await tries.reached(3)  # the refused first try and at least one retry
        assert not writer.done()
        other.execute("COMMIT")
        async with asyncio.timeout(10):
            await writer
        assert set(tries.threads) == {threading.get_ident()}


class _BeginTries:
    """Counts the BEGIN IMMEDIATE tries on the pool's one connection, and their threads."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self._changed = asyncio.Event()

    @classmethod
    async def watch(cls, db: Database) -> _BeginTries:
        tries = cls()
        async with db.read() as conn:
            raw = await conn.get_raw_connection()
            raw.driver_connection._connection.set_trace_callback(tries._trace)  # type: ignore[union-attr]
        return tries

    def _trace(self, statement: str) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            self.threads.append(threading.get_ident())
            self._changed.set()  # called on the loop's thread (the test checks it)

    async def reached(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.threads) < count:
                self._changed.clear()
                await self._changed.wait()


async def _delete_users(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(sa.delete(users))


async def test_a_writer_cancelled_while_waiting_for_the_lock_leaves_its_connection_clean(
    tmp_path: Path,
) -> None:
    """Cancelling a transaction that waits for another process's lock returns its connection to
    the pool outside any transaction: the next writer on it works and commits."""
    async with _beside_another_writer(tmp_path / "cancel.db", pool_size=1) as (db, other):
        tries = await _BeginTries.watch(db)
        other.execute("BEGIN IMMEDIATE")
        writer = asyncio.create_task(_delete_users(db))
        await tries.reached(2)  # refused, and waiting to try again
        assert not writer.done()
        writer.cancel()
        async with asyncio.timeout(10):
            await asyncio.wait({writer})
        assert writer.cancelled()
        other.execute("COMMIT")
        async with asyncio.timeout(10):
            await _delete_users(db)
        async with db.read() as conn:
            assert await conn.scalar(sa.select(sa.func.count()).select_from(users)) == 0
        other.execute("BEGIN IMMEDIATE")  # nobody holds the lock: taken at once
        other.execute("COMMIT")
