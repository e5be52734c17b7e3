"""SQLite calls on the event loop's own thread, instead of a worker thread per connection.

aiosqlite runs every call of a connection on that connection's thread and wakes the event loop
with the answer. Each hop needs Python's GIL in both threads, and the sqlite3 module gives the
GIL up around every step of a statement. With a busy event loop and a dozen pooled connections
the threads queue for the GIL (tens of thousands of futex waits per second were measured), a
statement of 50 µs took 1 to 5 ms, and a manager that fell behind stayed behind: submit →
RUNNING went from 130 ms to 1 to 2 s at 5 sessions per second.

On a local file almost every SQLite call returns within microseconds, so it runs inline here.
The one call that can wait is `BEGIN IMMEDIATE` when *another process* holds the write lock
(this process's writers take turns on an asyncio lock first, see `Database`): SQLite's busy
handler would then block the event loop. So that call is tried inline with no busy wait, and
while the lock is taken it is tried again after growing sleeps on the event loop, the steps of
SQLite's own busy handler, up to the connection's busy timeout. (Sending every `BEGIN
IMMEDIATE` to the worker thread cost a loaded manager 11 ms per write transaction, the thread
waiting for the GIL, while this process's other writers queued behind it: 6 of the 16 s of a
2,000-session `corral bench api` run. Waiting there only when the lock was taken left a
cancelled writer's BEGIN running in the thread, which took the lock later on a connection
already back in the pool.)
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import aiosqlite
import sqlalchemy as sa
from sqlalchemy.util import await_

_BUSY = object()  # another connection holds the write lock

# Rows fetched per step when a cursor is iterated (aiosqlite's default).
_ITER_CHUNK_SIZE = 64
# Prepared statements each connection keeps (sqlite3's default is 128). A manager runs about
# 130 distinct statements on SQLite, so with the default each pooled connection kept evicting
# and preparing again the ones it would run next: 1,024 made a 20,000-session `corral simulate`
# 3-8 % faster (5-8 % less CPU; benchmarks.md, session 19).
STATEMENT_CACHE = 1_024


class InlineConnection(aiosqlite.Connection):
    """An aiosqlite connection whose calls run inline; a BEGIN IMMEDIATE retries while locked."""

    _busy_timeout_ms: int | None = None  # the connection's own, read before the first try

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        if _may_wait_for_lock(args):
            return await self._until_not_busy(partial(fn, *args, **kwargs))
        return fn(*args, **kwargs)

    async def _until_not_busy(self, attempt: Callable[[], Any]) -> Any:
        """Run `attempt` inline, sleeping between tries while another process holds the lock.

        Nothing runs while it sleeps, so a cancelled caller leaves nothing behind.
        """
        result = self._try_without_waiting(attempt)
        if result is not _BUSY:
            return result
        assert self._busy_timeout_ms is not None
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        for delay_s in _busy_delays():
            await asyncio.sleep(min(delay_s, max(0.0, deadline - time.monotonic())))
            result = self._try_without_waiting(attempt)
            if result is not _BUSY:
                return result
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError("database is locked")
        raise AssertionError("unreachable: _busy_delays() never ends")

    def _try_without_waiting(self, attempt: Callable[[], Any]) -> Any:
        """Run `attempt` inline with SQLite's busy handler off; `_BUSY` if the lock was taken."""
        conn = cast(sqlite3.Connection, self._connection)
        if self._busy_timeout_ms is None:
            self._busy_timeout_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        conn.execute("PRAGMA busy_timeout=0")
        try:
            return attempt()
        except sqlite3.OperationalError as error:
            # The extended code (SQLITE_BUSY_RECOVERY, ...) carries the primary one in its low byte.
            if error.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            return _BUSY
        finally:
            conn.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms}")


def begin(connection: InlineConnection, statement: str) -> None:
    """Run `statement` (BEGIN or BEGIN IMMEDIATE) for SQLAlchemy's `begin` event.

    Called inside SQLAlchemy's greenlet, straight on the sqlite3 connection: going through
    `exec_driver_sql` cost 35 µs a transaction, a tenth of a busy manager's statement time.
    A BEGIN IMMEDIATE that finds another process's write lock waits on the event loop.
    """
    conn = cast(sqlite3.Connection, connection._connection)
    try:
        if _may_wait_for_lock((statement,)):
            await_(connection._until_not_busy(partial(conn.execute, statement)))
        else:
            conn.execute(statement)
    except sqlite3.Error as error:
        raise sa.exc.DBAPIError.instance(statement, (), error, sqlite3.Error) from error


def _busy_delays() -> Iterator[float]:
    """SQLite's own busy handler's sleeps (sqlite3.c, sqliteDefaultBusyCallback), then 100 ms."""
    yield from (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05, 0.05)
    while True:
        yield 0.1


def _may_wait_for_lock(args: tuple[Any, ...]) -> bool:
    return bool(args) and isinstance(args[0], str) and args[0].startswith("BEGIN IMMEDIATE")


async def connect(path: str) -> aiosqlite.Connection:
    """Open `path` (aiosqlite's worker thread still starts; it opens and closes the file)."""
    connector = partial(
        sqlite3.connect, path, check_same_thread=False, cached_statements=STATEMENT_CACHE
    )
    return await InlineConnection(connector, _ITER_CHUNK_SIZE)
