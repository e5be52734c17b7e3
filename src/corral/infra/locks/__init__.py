"""Task locks: a coordinator takes a task's lock before a run so two managers rarely run it at once.

The lock is an efficiency device, never the guard of correctness (guarded writes make a second
concurrent run a no-op), so every implementation prefers giving a lock up to holding it forever:
holds are released on exit, error and cancellation, and die with their holder (an advisory lock
with its connection, a Redis lock with its TTL). Every call to the lock's server is bounded in
time; a hold whose server stops answering is given up at once (`Hold.lost`), and a lock that
cannot be taken because the server is unreachable raises `LockUnavailableError`, on which the
caller runs its guarded work without the lock (DESIGN.md, "Coordination").
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Literal

__all__ = [
    "DEFAULT_LOCK_TTL_S",
    "Hold",
    "LockKind",
    "LockManager",
    "LockManagerClosedError",
    "LockUnavailableError",
    "address_owner",
    "open_lock_manager",
]

LockKind = Literal["memory", "postgres", "redis"]
LOCK_KINDS: tuple[LockKind, ...] = ("memory", "postgres", "redis")

# How long a Redis lock outlives a holder that stopped renewing it (a killed manager), and how
# long any call to a lock's server may take. Renewed every third of it while held.
DEFAULT_LOCK_TTL_S = 5.0


def address_owner(port: int) -> str:
    """The lock owner name of the manager listening on `port` of this host: a process that
    binds the port knows every earlier one of that name is gone (`take_over_predecessor`)."""
    return f"{socket.gethostname()}:{port}"


class LockUnavailableError(ConnectionError):
    """The lock's server cannot be reached (or did not answer in time): nobody knows who holds
    the lock. The caller may run its guarded work without it."""


class Hold:
    """What hold() yields: true if the lock was taken; `lost` once the hold is known gone (its
    renewal failed, its connection died), after which the holder should end its hold soon."""

    __slots__ = ("_lost", "taken")

    def __init__(self, taken: bool) -> None:
        self.taken = taken
        self._lost = False

    def __bool__(self) -> bool:
        return self.taken

    def __repr__(self) -> str:
        return f"Hold(taken={self.taken}, lost={self._lost})"

    @property
    def lost(self) -> bool:
        """Whether the lock was lost while held (always False for a hold not taken)."""
        return self._lost

    def lose(self) -> None:
        """Mark the hold lost (called by the lock manager)."""
        if self.taken:
            self._lost = True


class LockManagerClosedError(RuntimeError):
    """hold() was called on a LockManager after close()."""


class LockManager(ABC):
    """Named, non-blocking, exclusive locks shared by every manager on one backend."""

    @abstractmethod
    def hold(self, name: str) -> AbstractAsyncContextManager[Hold]:
        """Try to take `name` without waiting.

        Yields a true Hold while held (released on exit, also on error or cancellation), a false
        one if someone else holds it (nothing to release). A second hold() of a name this
        manager already holds yields a false one too. Raises LockUnavailableError when the
        lock's server cannot be reached in time.
        """

    @abstractmethod
    async def close(self) -> None:
        """Idempotent; releases anything still held."""

    async def take_over_predecessor(self, owner: str) -> int:
        """Name this manager's holds after `owner` from now on, and free the locks an earlier
        process of the same `owner` left behind; return how many were freed.

        `owner` names the manager's listening address (host name and port): a process that has
        bound it knows every earlier process of that owner is gone, so their locks guard
        nothing. Call it once, after binding and before any hold. Locks that die with their
        holder (advisory locks, in-process locks) have nothing to free.
        """
        return 0


async def open_lock_manager(
    kind: LockKind,
    *,
    prefix: str = "corral",
    postgres_dsn: str | None = None,
    redis_url: str | None = None,
    ttl_s: float = DEFAULT_LOCK_TTL_S,
) -> LockManager:
    """Open the lock manager of `kind`, connected and ready (a dead server fails here).

    `ttl_s`: a Redis lock's time to live (renewed every third of it while held); every call to
    the lock's server, Redis or PostgreSQL, is given at most that long.
    """
    if not ttl_s > 0:
        raise ValueError(f"lock ttl_s must be positive seconds, got {ttl_s!r}")
    if not prefix:
        raise ValueError("lock prefix must not be empty; use e.g. 'corral'")
    if kind == "memory":
        from corral.infra.locks.memory import MemoryLockManager

        return MemoryLockManager(prefix=prefix)
    if kind == "postgres":
        if postgres_dsn is None:
            raise ValueError("postgres locks need postgres_dsn (a postgresql://... URL)")
        from corral.infra.locks.postgres import PostgresLockManager

        return await PostgresLockManager.open(postgres_dsn, prefix=prefix, timeout_s=ttl_s)
    if kind == "redis":
        if redis_url is None:
            raise ValueError("redis locks need redis_url (a redis://... URL)")
        from corral.infra.locks.redis import RedisLockManager

        return await RedisLockManager.open(redis_url, prefix=prefix, ttl_s=ttl_s)
    raise ValueError(f"unknown lock kind {kind!r}; use one of {', '.join(LOCK_KINDS)}")
