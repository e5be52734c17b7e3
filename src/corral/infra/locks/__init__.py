"""Task locks: a coordinator takes a task's lock before a run so two managers rarely run it at once.

The lock is an efficiency device, never the guard of correctness (guarded writes make a second
concurrent run a no-op), so every implementation prefers giving a lock up to holding it forever:
holds are released on exit, error and cancellation, and die with their holder (an advisory lock
with its connection, a Redis lock with its TTL).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Literal

__all__ = ["LockKind", "LockManager", "LockManagerClosedError", "open_lock_manager"]

LockKind = Literal["memory", "postgres", "redis"]
LOCK_KINDS: tuple[LockKind, ...] = ("memory", "postgres", "redis")


class LockManagerClosedError(RuntimeError):
    """hold() was called on a LockManager after close()."""


class LockManager(ABC):
    """Named, non-blocking, exclusive locks shared by every manager on one backend."""

    @abstractmethod
    def hold(self, name: str) -> AbstractAsyncContextManager[bool]:
        """Try to take `name` without waiting.

        Yields True while held (released on exit, also on error or cancellation), False if
        someone else holds it (nothing to release). A second hold() of a name this manager
        already holds yields False too.
        """

    @abstractmethod
    async def close(self) -> None:
        """Idempotent; releases anything still held."""


async def open_lock_manager(
    kind: LockKind,
    *,
    prefix: str = "corral",
    postgres_dsn: str | None = None,
    redis_url: str | None = None,
    ttl_s: float = 30.0,
) -> LockManager:
    """Open the lock manager of `kind`, connected and ready (a dead server fails here)."""
    if not prefix:
        raise ValueError("lock prefix must not be empty; use e.g. 'corral'")
    if kind == "memory":
        from corral.infra.locks.memory import MemoryLockManager

        return MemoryLockManager(prefix=prefix)
    if kind == "postgres":
        if postgres_dsn is None:
            raise ValueError("postgres locks need postgres_dsn (a postgresql://... URL)")
        from corral.infra.locks.postgres import PostgresLockManager

        return await PostgresLockManager.open(postgres_dsn, prefix=prefix)
    if kind == "redis":
        if redis_url is None:
            raise ValueError("redis locks need redis_url (a redis://... URL)")
        from corral.infra.locks.redis import RedisLockManager

        return await RedisLockManager.open(redis_url, prefix=prefix, ttl_s=ttl_s)
    raise ValueError(f"unknown lock kind {kind!r}; use one of {', '.join(LOCK_KINDS)}")
