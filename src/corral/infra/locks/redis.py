"""Redis locks: SET NX with a TTL, renewed while held, released by compare-and-delete.

A holder that dies stops renewing and its lock expires after the TTL. Every write after the SET
checks the random token first, so a holder whose lock expired and was re-taken never extends or
deletes the new holder's lock.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from corral.infra._redis import redis_client
from corral.infra.locks import LockManager, LockManagerClosedError
from corral.infra.locks._background import run_to_completion, wait_for_tasks

logger = logging.getLogger(__name__)

DEFAULT_TTL_S = 30.0

# KEYS[1] = lock key, ARGV[1] = holder's token, ARGV[2] = new TTL in milliseconds
_RENEW_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] = lock key, ARGV[1] = holder's token
_RELEASE_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class RedisLockManager(LockManager):
    """Locks at '{prefix}:lock:{name}' holding a random token, with a TTL renewed every ttl/3."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str,
        ttl_s: float = DEFAULT_TTL_S,
        renew_interval_s: float | None = None,
        owns_client: bool = False,
    ) -> None:
        """`renew_interval_s` defaults to ttl_s / 3; tests set it past the TTL to play a frozen
        holder. `owns_client` makes close() close the client too."""
        if ttl_s <= 0:
            raise ValueError(f"lock ttl_s must be positive, got {ttl_s}")
        self.prefix = prefix
        self._client = client
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._renew_interval_s = ttl_s / 3 if renew_interval_s is None else renew_interval_s
        self._owns_client = owns_client
        self._renew = client.register_script(_RENEW_LUA)
        self._release_script = client.register_script(_RELEASE_LUA)
        self._held: dict[str, tuple[str, asyncio.Task[None]]] = {}  # token -> (key, renewal)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        prefix: str,
        ttl_s: float = DEFAULT_TTL_S,
        renew_interval_s: float | None = None,
    ) -> RedisLockManager:
        """A manager with its own client on `url`, PINGed so a dead server fails here."""
        client = redis_client(url)
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        return cls(
            client,
            prefix=prefix,
            ttl_s=ttl_s,
            renew_interval_s=renew_interval_s,
            owns_client=True,
        )

    def key(self, name: str) -> str:
        """The Redis key of the lock `name`."""
        return f"{self.prefix}:lock:{name}"

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[bool]:
        """Try to take `name` without waiting; yield whether it was taken."""
        if self._closed:
            raise LockManagerClosedError("this lock manager is closed; open a new one")
        key = self.key(name)
        token = secrets.token_hex(16)
        taken = await run_to_completion(
            self._take(name, key, token),
            tasks=self._tasks,
            undo=lambda _taken: self._release(token),  # a no-op unless it was taken
        )
        if not taken:
            yield False
            return
        try:
            yield True
        finally:
            await run_to_completion(self._release(token), tasks=self._tasks)

    async def close(self) -> None:
        """Release every held lock, then close the client if this manager opened it."""
        if self._closed:
            return
        self._closed = True
        await wait_for_tasks(self._tasks)
        await asyncio.gather(*(self._release(token) for token in list(self._held)))
        if self._owns_client:
            await self._client.aclose()

    async def _take(self, name: str, key: str, token: str) -> bool:
        if not await self._client.set(key, token, nx=True, px=self._ttl_ms):
            return False
        renewal = asyncio.create_task(self._keep_renewed(name, key, token))
        self._held[token] = (key, renewal)
        return True

    async def _keep_renewed(self, name: str, key: str, token: str) -> None:
        while True:
            await asyncio.sleep(self._renew_interval_s)
            try:
                async with asyncio.timeout(self._renew_interval_s):
                    renewed = await self._renew(keys=[key], args=[token, self._ttl_ms])
            except (RedisError, OSError) as exc:  # TimeoutError is an OSError
                # Keep trying: the lock stays ours until the TTL runs out.
                logger.warning(
                    "locks.renew_failed", extra={"lock": name, "error": type(exc).__name__}
                )
                continue
            if not renewed:
                logger.warning("locks.lost", extra={"lock": name, "lock_prefix": self.prefix})
                return

    async def _release(self, token: str) -> None:
        held = self._held.pop(token, None)
        if held is None:
            return  # released already (by close())
        key, renewal = held
        renewal.cancel()
        await asyncio.wait({renewal})
        if not renewal.cancelled() and (error := renewal.exception()) is not None:
            logger.error("locks.renewal_failed", extra={"lock_key": key}, exc_info=error)
        try:
            await self._release_script(keys=[key], args=[token])
        except (RedisError, OSError) as exc:
            # Not renewed any more, so it expires within the TTL; the holder's work is done.
            logger.warning(
                "locks.release_failed", extra={"lock_key": key, "error": type(exc).__name__}
            )
