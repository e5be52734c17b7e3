"""SQLite calls run on the event loop's thread; only a wait for another process's lock does not."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import sqlalchemy as sa

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


async def test_waiting_for_another_writer_does_not_block_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    db = Database.open(f"sqlite:///{path}")
    await upgrade(db)
    other = sqlite3.connect(path, isolation_level=None)  # another process's writer, in effect
    try:
        other.execute("BEGIN IMMEDIATE")
        ticking = asyncio.Event()

        async def tick() -> None:
            for _ in range(20):
                await asyncio.sleep(0.001)
            ticking.set()

        async def write() -> None:
            async with db.transaction() as conn:
                await conn.execute(sa.delete(users))

        ticker = asyncio.create_task(tick())
        writer = asyncio.create_task(write())
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
    finally:
        other.close()
        await db.close()
