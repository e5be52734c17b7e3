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
handler would then block the event loop, so that call still goes through the worker thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any

import aiosqlite

# Rows fetched per step when a cursor is iterated (aiosqlite's default).
_ITER_CHUNK_SIZE = 64


class InlineConnection(aiosqlite.Connection):
    """An aiosqlite connection whose calls run inline, except those that may wait for a lock."""

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _may_wait_for_lock(args):
            return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)


def _may_wait_for_lock(args: tuple[Any, ...]) -> bool:
    return bool(args) and isinstance(args[0], str) and args[0].startswith("BEGIN IMMEDIATE")


async def connect(path: str) -> aiosqlite.Connection:
    """Open `path` (its own worker thread still starts, for lock waits and closing)."""
    connector = partial(sqlite3.connect, path, check_same_thread=False)
    return await InlineConnection(connector, _ITER_CHUNK_SIZE)
