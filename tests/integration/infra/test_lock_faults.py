"""Locks under faults (issue 32, defect 2): nothing hangs, a failing hold is given up, an
unreachable server says so. Redis is a server of the test's own, killed at will; PostgreSQL is
reached through a proxy that is cut, never stopped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.infra.locks import LockUnavailableError, open_lock_manager
from corral.infra.locks.redis import RedisLockManager
from corral.testing.redis_server import RedisServer
from corral.testing.tcp_proxy import TcpProxy
from tests.conftest import POSTGRES_URL, through_proxy

DEADLINE_S = 10.0


async def eventually(predicate: Any, timeout_s: float = DEADLINE_S) -> None:
    """Return once `predicate()` is true; fail after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"still false after {timeout_s} s"
        await asyncio.sleep(0.01)


class SwallowingRenewal:
    """A renew script whose call swallows the cancel landing as its reply arrives, as
    redis-py's `wait_for` does on Python 3.11: the call returns 1 (renewed) instead."""

    def __init__(self) -> None:
        self.calls = 0
        self.in_call = asyncio.Event()

    async def __call__(self, *, keys: list[str], args: list[Any]) -> int:
        self.calls += 1
        self.in_call.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return 1  # the reply won the race: the cancel is lost
        return 1


async def test_release_is_bounded_when_a_renewal_swallows_its_cancel(
    redis_url: str, namespace: str
) -> None:
    """Leaving a hold returns promptly and the lock is free, although the renewal in flight
    ate the cancel meant to stop it (before the fix: the release waited forever and the
    renewal kept the lock alive)."""
    holder = await RedisLockManager.open(
        redis_url, prefix=namespace, ttl_s=3.0, renew_interval_s=0.01
    )
    other = await RedisLockManager.open(redis_url, prefix=namespace, ttl_s=3.0)
    renewal = SwallowingRenewal()
    holder._renew = renewal  # type: ignore[assignment]
    try:
        async with asyncio.timeout(DEADLINE_S):
            async with holder.hold("task") as held:
                assert held
                await renewal.in_call.wait()  # the cancel will land inside the renew call
            async with other.hold("task") as taken:
                assert taken  # released, not renewed on
        assert renewal.calls == 1
    finally:
        async with asyncio.timeout(DEADLINE_S):
            await holder.close()
            await other.close()


async def test_a_hold_whose_renewal_fails_is_lost_at_once(
    own_redis: RedisServer, namespace: str
) -> None:
    """Redis killed under a hold: the next renewal fails, the hold is marked lost within a
    renewal interval, and leaving it is prompt."""
    holder = await RedisLockManager.open(own_redis.url, prefix=namespace, ttl_s=0.6)
    try:
        async with asyncio.timeout(DEADLINE_S):
            async with holder.hold("task") as held:
                assert held and not held.lost
                own_redis.kill()
                await eventually(lambda: held.lost)
    finally:
        async with asyncio.timeout(DEADLINE_S):
            await holder.close()


async def test_taking_a_lock_on_a_dead_redis_raises_lock_unavailable(
    own_redis: RedisServer, namespace: str
) -> None:
    """With its Redis gone, hold() raises LockUnavailableError within the call deadline, and
    takes locks again once Redis is back."""
    locks = await open_lock_manager("redis", prefix=namespace, redis_url=own_redis.url, ttl_s=1.0)
    try:
        own_redis.kill()
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(LockUnavailableError):
                async with locks.hold("task"):
                    pytest.fail("a lock was taken on a dead server")
        own_redis.start()
        async with asyncio.timeout(DEADLINE_S), locks.hold("task") as held:
            assert held
    finally:
        await locks.close()


@pytest.mark.postgres
async def test_postgres_locks_behind_a_cut_connection_are_lost_or_unavailable(
    postgres_proxy: TcpProxy, namespace: str
) -> None:
    """A cut PostgreSQL connection marks the holds on it lost; while cut, hold() raises
    LockUnavailableError within the timeout; restored, locks are taken again."""
    locks = await open_lock_manager(
        "postgres",
        prefix=namespace,
        postgres_dsn=through_proxy(POSTGRES_URL, postgres_proxy),
        ttl_s=1.0,
    )
    try:
        async with asyncio.timeout(DEADLINE_S):
            async with locks.hold("task") as held:
                assert held
                postgres_proxy.cut()
                await eventually(lambda: held.lost)
            with pytest.raises(LockUnavailableError):
                async with locks.hold("task"):
                    pytest.fail("a lock was taken through a cut connection")
        postgres_proxy.stall()
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(LockUnavailableError):
                async with locks.hold("task"):
                    pytest.fail("a lock was taken from a silent server")
        postgres_proxy.restore()
        async with asyncio.timeout(DEADLINE_S), locks.hold("task") as held:
            assert held
    finally:
        postgres_proxy.restore()
        async with asyncio.timeout(DEADLINE_S):
            await locks.close()
