"""In-process locks for the embedded mode, where one process runs every coordinator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from corral.infra.locks import Hold, LockManager, LockManagerClosedError


class MemoryLockManager(LockManager):
    """One asyncio.Lock per name, taken only when free; shared by whoever shares this object."""

    def __init__(self, *, prefix: str = "corral") -> None:
        self.prefix = prefix
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[Hold]:
        """Try to take `name` without waiting; yield whether it was taken."""
        if self._closed:
            raise LockManagerClosedError("this lock manager is closed; open a new one")
        if name in self._locks:
            yield Hold(False)
            return
        lock = self._locks[name] = asyncio.Lock()
        # Free and never waited on, so acquire() returns without suspending: no cancellation
        # can land between taking the lock and the try below.
        await lock.acquire()
        try:
            yield Hold(True)
        finally:
            # close() may have released it already, and a new holder may own the name since.
            if self._locks.get(name) is lock:
                del self._locks[name]
                lock.release()

    async def close(self) -> None:
        """Release every held lock (idempotent)."""
        self._closed = True
        locks, self._locks = self._locks, {}
        for lock in locks.values():
            lock.release()
