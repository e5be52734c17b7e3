"""PostgreSQL session-level advisory locks, held on one dedicated connection per manager.

The locks live in the server session, so they die with it: a crashed manager's connection drops
and its locks are free again. That is why they are held on a raw asyncpg connection of their own
and never on a pooled SQLAlchemy connection, which would go back to the pool still holding them.

Every wait is bounded by `timeout_s`: for the connection (one query at a time), for connecting,
for each query. A take that cannot reach the server raises LockUnavailableError; a connection
that dies marks every hold on it lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from corral.infra.locks import (
    DEFAULT_LOCK_TTL_S,
    Hold,
    LockManager,
    LockManagerClosedError,
    LockUnavailableError,
)
from corral.infra.locks._background import run_to_completion, wait_for_tasks

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = DEFAULT_LOCK_TTL_S

# Errors after which a closed connection means "lost"; on an open one they are real errors.
_CONNECTION_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)


def lock_key(prefix: str, name: str) -> int:
    """The advisory lock key of `name`: SHA-256 of '{prefix}:lock:{name}', first 8 bytes, signed."""
    digest = hashlib.sha256(f"{prefix}:lock:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def asyncpg_dsn(dsn: str) -> str:
    """Turn a postgresql:// (or postgresql+asyncpg://) URL into the DSN asyncpg accepts."""
    scheme, separator, rest = dsn.partition("://")
    if not separator:
        raise ValueError("the PostgreSQL DSN is not a URL; use postgresql://user@host:5432/db")
    if scheme.lower() not in ("postgresql", "postgres", "postgresql+asyncpg", "postgres+asyncpg"):
        raise ValueError(
            f"PostgreSQL DSN scheme {scheme!r} is not supported; use postgresql://user@host/db"
        )
    return f"postgresql://{rest}"


class LockConnectionLostError(ConnectionError):
    """The lock connection died (or stopped answering) while in use; its locks are gone."""


class PostgresLockManager(LockManager):
    """pg_try_advisory_lock on one connection, reconnected on the next use after it is lost."""

    def __init__(self, dsn: str, *, prefix: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.prefix = prefix
        self._dsn = asyncpg_dsn(dsn)
        self._timeout_s = timeout_s
        self._conn: Any = None  # asyncpg.Connection | None; asyncpg ships no types
        self._conn_lock = asyncio.Lock()  # one query at a time on the connection
        # Bumped whenever the connection goes: a hold taken in an older generation died with it.
        self._generation = 0
        # PostgreSQL advisory locks are re-entrant within a session, so this guard is what makes
        # a second hold() of a name in this manager yield False. A name taken: its Hold.
        self._held: dict[str, Hold | None] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    async def open(
        cls, dsn: str, *, prefix: str, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> PostgresLockManager:
        """A manager whose connection is already open (an unreachable server fails here)."""
        manager = cls(dsn, prefix=prefix, timeout_s=timeout_s)
        async with manager._conn_lock:
            await manager._connection()
        return manager

    @property
    def server_pid(self) -> int | None:
        """The server process id of the lock connection (None when not connected)."""
        if self._conn is None or self._conn.is_closed():
            return None
        return int(self._conn.get_server_pid())

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[Hold]:
        """Try to take `name` without waiting; yield whether it was taken."""
        if self._closed:
            raise LockManagerClosedError("this lock manager is closed; open a new one")
        if name in self._held:
            yield Hold(False)
            return
        key = lock_key(self.prefix, name)
        self._held[name] = None
        try:
            generation = await run_to_completion(
                self._try_lock(key),
                tasks=self._tasks,
                undo=lambda taken: self._unlock(key, taken),
            )
        except BaseException:
            self._held.pop(name, None)
            raise
        if generation is None:
            self._held.pop(name, None)
            yield Hold(False)
            return
        hold = self._held[name] = Hold(True)
        if generation != self._generation:
            hold.lose()  # the connection went between the take and now
        try:
            yield hold
        finally:
            await run_to_completion(self._release(name, key, generation), tasks=self._tasks)

    async def close(self) -> None:
        """Close the connection, which frees every lock it holds (idempotent)."""
        self._closed = True
        await wait_for_tasks(self._tasks)
        async with self._conn_lock:
            conn, self._conn = self._conn, None
            self._generation += 1
            if conn is not None:
                try:
                    # Unlock explicitly: the server ends a closed session a little later, and
                    # other managers should find the locks free as soon as close() returns.
                    await conn.execute("SELECT pg_advisory_unlock_all()", timeout=self._timeout_s)
                    await conn.close(timeout=self._timeout_s)
                except _CONNECTION_ERRORS:  # TimeoutError is an OSError
                    conn.terminate()  # the server frees the locks when the socket goes

    async def _try_lock(self, key: int) -> int | None:
        """The generation the lock was taken in, or None if someone else holds it."""
        try:
            # Bounded: behind a hung query the others wait at most one timeout, not one each.
            async with asyncio.timeout(self._timeout_s):
                await self._conn_lock.acquire()
        except TimeoutError as exc:
            raise LockUnavailableError("the PostgreSQL lock connection is busy") from exc
        try:
            if self._closed:
                raise LockManagerClosedError("this lock manager is closed; open a new one")
            sql = "SELECT pg_try_advisory_lock($1)"
            try:
                try:
                    taken = await self._query(await self._connection(), sql, key)
                except LockConnectionLostError:
                    # Found dead on use: once more on a fresh connection.
                    taken = await self._query(await self._connection(), sql, key)
            except (LockConnectionLostError, *_CONNECTION_ERRORS) as exc:
                raise LockUnavailableError(
                    f"PostgreSQL did not take the lock: {type(exc).__name__}: {exc}"
                ) from exc
            return self._generation if taken else None
        finally:
            self._conn_lock.release()

    async def _release(self, name: str, key: int, generation: int) -> None:
        try:
            await self._unlock(key, generation)
        finally:
            self._held.pop(name, None)

    async def _unlock(self, key: int, generation: int | None) -> None:
        async with self._conn_lock:
            if generation is None or self._closed or generation != self._generation:
                return  # never taken, or gone with its connection
            conn = self._conn
            if conn.is_closed():
                self._lose(conn, reason="closed")
                return
            try:
                released = await self._query(conn, "SELECT pg_advisory_unlock($1)", key)
            except LockConnectionLostError:
                return  # the server freed the lock with the session
            if not released:
                logger.warning("locks.unlock_not_held", extra={"lock_key": key})

    async def _query(self, conn: Any, sql: str, key: int) -> bool:
        """Run a lock function; a dead or silent connection becomes LockConnectionLostError."""
        try:
            return bool(await conn.fetchval(sql, key, timeout=self._timeout_s))
        except TimeoutError as exc:
            # The server may have granted the lock unseen; ending the session frees it.
            self._lose(conn, reason="timeout")
            conn.terminate()
            raise LockConnectionLostError("the PostgreSQL lock connection timed out") from exc
        except asyncpg.exceptions.InternalClientError as exc:
            # The server ended the session while a query was on the wire: asyncpg's protocol
            # state is broken ("cannot switch to state ..."); the connection is unusable.
            self._lose(conn, reason="broken")
            conn.terminate()
            raise LockConnectionLostError("the PostgreSQL lock connection broke") from exc
        except _CONNECTION_ERRORS as exc:
            if not conn.is_closed():
                raise
            self._lose(conn, reason="closed")
            raise LockConnectionLostError("the PostgreSQL lock connection was lost") from exc

    async def _connection(self) -> Any:
        """The open lock connection, connecting if needed (call with _conn_lock held)."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        if conn is not None:
            self._lose(conn, reason="closed")
        conn = await asyncpg.connect(self._dsn, timeout=self._timeout_s)
        conn.add_termination_listener(self._on_terminated)
        self._conn = conn
        return conn

    def _on_terminated(self, conn: Any) -> None:
        # Called soon after the socket closes, also when nobody is using the connection: holders
        # learn of the loss here rather than at the next hold().
        if conn is self._conn:
            self._lose(conn, reason="terminated")

    def _lose(self, conn: Any, *, reason: str) -> None:
        """Forget a connection that died (or is being killed), and every hold taken on it."""
        if conn is not self._conn:
            return
        self._conn = None
        self._generation += 1
        for hold in self._held.values():
            if hold is not None:
                hold.lose()
        logger.warning(
            "locks.connection_lost",
            extra={"lock_prefix": self.prefix, "holds_lost": len(self._held), "reason": reason},
        )
