"""Redis locks: SET NX with a TTL, renewed while held, released by compare-and-delete.

A holder that dies stops renewing and its lock expires after the TTL (`lock_ttl_s`, a few
seconds). Every write after the SET checks the random token first, so a holder whose lock
expired and was re-taken never extends or deletes the new holder's lock.

Nothing here waits without a bound: every Redis call has a deadline, a renewal that fails (an
error, no answer in time, or the lock found taken over) gives the hold up at once (`Hold.lost`;
the key expires by itself), and release waits for the renewal task at most one call's deadline.

A lock's token starts with its holder's owner name (`take_over_predecessor`): a manager that
restarts on the same address frees what its killed predecessor held at once, instead of every
manager waiting out the TTL for those tasks (issue 32: with a manager killed every 5 s and a 5 s
TTL, the tasks its predecessor held were blocked most of the time).
The renewal task stops on a flag, not only on cancellation: on Python 3.11 a cancel that lands as
redis-py's `wait_for` completes is swallowed, and a renewal relying on cancellation alone would
renew the lock forever while release waited for it (issue 32, defect 2).
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
from corral.infra.locks import (
    DEFAULT_LOCK_TTL_S,
    Hold,
    LockManager,
    LockManagerClosedError,
    LockUnavailableError,
)
from corral.infra.locks._background import run_to_completion, wait_for_tasks

logger = logging.getLogger(__name__)

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

# KEYS[1] = lock key, ARGV[1] = "{owner}/": deletes the lock if an earlier process of this
# owner holds it
_FREE_PREDECESSOR_LUA = """
local value = redis.call('get', KEYS[1])
if value and string.sub(value, 1, string.len(ARGV[1])) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""
_OWNER_END = "/"  # ends the owner part of a token

# Errors meaning "Redis did not answer"; TimeoutError (our deadlines) is an OSError.
_REDIS_ERRORS = (RedisError, OSError)


class _Held:
    """One hold's state: its key, what the holder sees, whether release began, its renewal."""

    __slots__ = ("hold", "key", "name", "released", "renewal")

    def __init__(self, name: str, key: str, hold: Hold) -> None:
        self.name = name
        self.key = key
        self.hold = hold
        self.released = False  # set by release: the renewal stops at its next step
        self.renewal: asyncio.Task[None] | None = None


class RedisLockManager(LockManager):
    """Locks at '{prefix}:lock:{name}' holding a random token, with a TTL renewed every ttl/3."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str,
        ttl_s: float = DEFAULT_LOCK_TTL_S,
        renew_interval_s: float | None = None,
        owns_client: bool = False,
    ) -> None:
        """`renew_interval_s` defaults to ttl_s / 3; tests set it past the TTL to play a frozen
        holder. `owns_client` makes close() close the client too."""
        if not ttl_s > 0:
            raise ValueError(f"lock ttl_s must be positive, got {ttl_s}")
        self.prefix = prefix
        self._client = client
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._renew_interval_s = ttl_s / 3 if renew_interval_s is None else renew_interval_s
        # A call's deadline: a renewal sent at ttl/3 that answers by 2·ttl/3 is in time.
        self._call_timeout_s = ttl_s / 3
        self._owns_client = owns_client
        self._renew = client.register_script(_RENEW_LUA)
        self._release_script = client.register_script(_RELEASE_LUA)
        self._free_predecessor = client.register_script(_FREE_PREDECESSOR_LUA)
        self._owner = ""  # the owner part of every token, once take_over_predecessor named it
        self._held: dict[str, _Held] = {}  # by token
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        prefix: str,
        ttl_s: float = DEFAULT_LOCK_TTL_S,
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
    async def hold(self, name: str) -> AsyncIterator[Hold]:
        """Try to take `name` without waiting; yield whether it was taken."""
        if self._closed:
            raise LockManagerClosedError("this lock manager is closed; open a new one")
        key = self.key(name)
        token = self._owner + secrets.token_hex(16)
        hold = await run_to_completion(
            self._take(name, key, token),
            tasks=self._tasks,
            undo=lambda _hold: self._release(token),  # a no-op unless it was taken
        )
        if not hold:
            yield hold
            return
        try:
            yield hold
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

    async def take_over_predecessor(self, owner: str) -> int:
        """Free the locks whose token names `owner` (an earlier process at this address) and
        name this manager's tokens after it. Bounded and never raising: a Redis that does not
        answer leaves those locks to their TTL."""
        if not owner or _OWNER_END in owner:
            raise ValueError(f"a lock owner must be non-empty without {_OWNER_END!r}: {owner!r}")
        if self._held:
            raise RuntimeError("take_over_predecessor must come before any hold")
        mine = owner + _OWNER_END
        freed = 0
        try:
            async with asyncio.timeout(self._call_timeout_s * 3):
                async for key in self._client.scan_iter(match=f"{self.prefix}:lock:*"):
                    freed += int(await self._free_predecessor(keys=[key], args=[mine]))
        except _REDIS_ERRORS as exc:
            logger.warning(
                "locks.take_over_failed",
                extra={"owner": owner, "lock_prefix": self.prefix, "error": type(exc).__name__},
            )
        self._owner = mine
        if freed:
            logger.info("locks.predecessor_freed", extra={"owner": owner, "locks": freed})
        return freed

    async def _take(self, name: str, key: str, token: str) -> Hold:
        try:
            async with asyncio.timeout(self._call_timeout_s):
                taken = await self._client.set(key, token, nx=True, px=self._ttl_ms)
        except _REDIS_ERRORS as exc:
            # If the SET went through unseen, the key expires after the TTL: nobody renews it.
            raise LockUnavailableError(
                f"Redis did not take lock {name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        if not taken:
            return Hold(False)
        held = _Held(name, key, Hold(True))
        held.renewal = asyncio.create_task(self._keep_renewed(held, token), name=f"lock-{name}")
        self._held[token] = held
        return held.hold

    async def _keep_renewed(self, held: _Held, token: str) -> None:
        """Renew every interval until released; on the first failure give the hold up."""
        while True:
            await asyncio.sleep(self._renew_interval_s)
            if held.released:
                return  # also when a cancel was swallowed by a call that completed
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    renewed = await self._renew(keys=[held.key], args=[token, self._ttl_ms])
            except _REDIS_ERRORS as exc:
                self._give_up(held, "locks.renew_failed", type(exc).__name__)
                return
            if held.released:
                return
            if not renewed:
                self._give_up(held, "locks.lost", "taken over or expired")
                return

    def _give_up(self, held: _Held, event: str, error: str) -> None:
        """The hold can no longer be vouched for: tell its holder; the key expires on its own."""
        held.hold.lose()
        logger.warning(event, extra={"lock": held.name, "lock_prefix": self.prefix, "error": error})

    async def _release(self, token: str) -> None:
        held = self._held.pop(token, None)
        if held is None:
            return  # released already (by close())
        held.released = True
        renewal = held.renewal
        if renewal is not None and not renewal.done():
            renewal.cancel()
            # Bounded: the flag ends the renewal at its next step even if this cancel is
            # swallowed, and a renewal call has a deadline of its own.
            await asyncio.wait({renewal}, timeout=self._call_timeout_s)
            if not renewal.done():
                logger.warning("locks.renewal_stuck", extra={"lock": held.name})
        elif renewal is not None and not renewal.cancelled() and renewal.exception() is not None:
            error = renewal.exception()
            logger.error("locks.renewal_failed", extra={"lock": held.name}, exc_info=error)
        try:
            async with asyncio.timeout(self._call_timeout_s):
                await self._release_script(keys=[held.key], args=[token])
        except _REDIS_ERRORS as exc:
            # Not renewed any more, so it expires within the TTL; the holder's work is done.
            logger.warning(
                "locks.release_failed", extra={"lock": held.name, "error": type(exc).__name__}
            )


async def free_predecessor_locks(
    url: str, *, prefix: str, owner: str, ttl_s: float = DEFAULT_LOCK_TTL_S
) -> int:
    """Free the locks an earlier process named `owner` left, with a client of its own: what a
    restarting manager does first, before loading the rest of itself (issue 32). Bounded; a
    Redis that cannot be reached frees nothing (the manager's own take-over tries again)."""
    try:
        manager = await RedisLockManager.open(url, prefix=prefix, ttl_s=ttl_s)
    except _REDIS_ERRORS:
        return 0
    try:
        return await manager.take_over_predecessor(owner)
    finally:
        await manager.close()
