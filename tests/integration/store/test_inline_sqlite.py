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


async def test_an_uncontended_writer_begins_on_the_loop_thread_and_a_contended_one_does_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / "begin.db"
    db = Database.open(f"sqlite:///{path}", pool_size=1)
    await upgrade(db)
    began_on: list[int] = []  # the thread of each BEGIN IMMEDIATE, from any thread
    loop = asyncio.get_running_loop()
    counted = asyncio.Condition()

    async def notify() -> None:
        async with counted:
            counted.notify_all()

    def trace(statement: str) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            began_on.append(threading.get_ident())
            loop.call_soon_threadsafe(lambda: loop.create_task(notify()))

    async def began(times: int) -> None:
        async with asyncio.timeout(10), counted:
            await counted.wait_for(lambda: len(began_on) >= times)

    other = sqlite3.connect(path, isolation_level=None)
    try:
        async with db.read() as conn:
            raw = await conn.get_raw_connection()
            raw.driver_connection._connection.set_trace_callback(trace)  # type: ignore[union-attr]
        async with db.transaction() as conn:
            await conn.execute(sa.delete(users))
        assert began_on == [threading.get_ident()]

        other.execute("BEGIN IMMEDIATE")
        writer = asyncio.create_task(_delete_users(db))
        await began(2)  # the refused inline try, then the wait in the worker
        other.execute("COMMIT")
        async with asyncio.timeout(10):
            await writer
        assert began_on[1] == threading.get_ident()  # the try that found the lock taken
        assert began_on[2:] and all(t != threading.get_ident() for t in began_on[2:])

        # The busy handler is back after both paths: a contended writer waits, it does not fail.
        other.execute("BEGIN IMMEDIATE")
        writer = asyncio.create_task(_delete_users(db))
        await began(5)  # the worker's try is under way
        assert not writer.done()
        other.execute("COMMIT")
        async with asyncio.timeout(10):
            await writer
    finally:
        other.close()
        await db.close()


async def _delete_users(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute(sa.delete(users))
