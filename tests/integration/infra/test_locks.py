"""The LockManager contract, run against the in-process, PostgreSQL and Redis backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import cast

import asyncpg
import pytest
import redis.asyncio as aioredis

from corral.infra.locks import LockKind, LockManager, LockManagerClosedError, open_lock_manager
from corral.infra.locks.postgres import PostgresLockManager, lock_key
from corral.infra.locks.redis import RedisLockManager
from tests.conftest import POSTGRES_URL, REDIS_URL, require_server

POSTGRES = pytest.param("postgres", marks=pytest.mark.postgres)
REDIS = pytest.param("redis", marks=pytest.mark.redis)
DEADLINE_S = 10.0


@dataclass
class Managers:
    """Two managers on one backend; for memory both are one object (memory shares nothing)."""

    first: LockManager
    second: LockManager
    open_another: Callable[[], Awaitable[LockManager]]


@pytest.fixture(params=["memory", POSTGRES, REDIS])
def backend(request: pytest.FixtureRequest) -> LockKind:
    """The lock backend under test (skips, or fails in CI, when its server is down)."""
    # A sync fixture: the reachability probes run their own event loop.
    if request.param == "postgres":
        require_server("PostgreSQL", request.getfixturevalue("postgres_unreachable"))
    elif request.param == "redis":
        request.getfixturevalue("redis_url")
    return cast(LockKind, request.param)


@pytest.fixture
async def managers(backend: LockKind, namespace: str) -> AsyncIterator[Managers]:
    """Two lock managers sharing one backend, as two coordinating manager processes would."""
    opened: list[LockManager] = []

    async def open_another() -> LockManager:
        manager = await open_lock_manager(
            backend, prefix=namespace, postgres_dsn=POSTGRES_URL, redis_url=REDIS_URL
        )
        opened.append(manager)
        return manager

    first = await open_another()
    second = first if backend == "memory" else await open_another()
    try:
        yield Managers(first, second, open_another)
    finally:
        for manager in opened:
            await manager.close()


async def eventually_hold(manager: LockManager, name: str, stack: AsyncExitStack) -> None:
    """Poll until `manager` takes `name` (held until `stack` closes); fail at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not await stack.enter_async_context(manager.hold(name)):
        assert loop.time() < deadline, f"{name!r} was not free within {DEADLINE_S} s"
        await asyncio.sleep(0.02)


async def test_held_lock_is_refused_to_the_same_and_another_manager(managers: Managers) -> None:
    """While a name is held, hold() yields False in the holding manager and in another one."""
    async with managers.first.hold("task") as held:
        assert held
        async with managers.first.hold("task") as again, managers.second.hold("task") as other:
            assert not again
            assert not other


async def test_refused_hold_releases_nothing(managers: Managers) -> None:
    """Leaving a hold that yielded False leaves the holder's lock in place."""
    async with managers.first.hold("task") as held:
        assert held
        for _ in range(2):
            async with managers.second.hold("task") as other:
                assert not other


async def test_released_lock_can_be_taken_again(managers: Managers) -> None:
    """After the holder leaves, both managers can take the name again."""
    async with managers.first.hold("task") as held:
        assert held
    async with managers.second.hold("task") as other:
        assert other
    async with managers.first.hold("task") as again:
        assert again


async def test_different_names_do_not_conflict(managers: Managers) -> None:
    """Holding one name does not block another."""
    async with managers.first.hold("schedule") as one, managers.second.hold("terminate") as two:
        assert one
        assert two


async def test_lock_is_released_on_exception(managers: Managers) -> None:
    """An error inside the hold releases the lock and propagates."""
    with pytest.raises(RuntimeError, match="boom"):
        async with managers.first.hold("task") as held:
            assert held
            raise RuntimeError("boom")
    async with managers.second.hold("task") as other:
        assert other


async def test_lock_is_released_on_cancellation(managers: Managers) -> None:
    """Cancelling a task inside the hold releases the lock."""
    entered = asyncio.Event()

    async def hold_forever() -> None:
        async with managers.first.hold("task") as held:
            assert held
            entered.set()
            await asyncio.Future()  # until cancelled

    task = asyncio.create_task(hold_forever())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with managers.second.hold("task") as other:
        assert other


async def test_cancellation_while_taking_does_not_leak(managers: Managers) -> None:
    """A hold cancelled while the lock is being taken never leaves the lock held."""

    async def hold_forever() -> None:
        async with managers.first.hold("task"):
            await asyncio.Future()  # until cancelled

    task = asyncio.create_task(hold_forever())
    await asyncio.sleep(0)  # let it start taking the lock, then cancel mid-way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Queued behind the abandoned attempt, so that attempt has reached the server by now.
    async with managers.first.hold("other") as other:
        assert other
    async with AsyncExitStack() as stack:
        await eventually_hold(managers.second, "task", stack)


@pytest.mark.parametrize("backend", [POSTGRES, REDIS], indirect=True)
async def test_close_releases_held_locks(managers: Managers) -> None:
    """close() frees what the manager holds for other managers; the holder's exit stays harmless."""
    closing = await managers.open_another()
    async with closing.hold("task") as held:
        assert held
        await closing.close()
        async with managers.second.hold("task") as other:
            assert other


async def test_close_is_idempotent_and_final(managers: Managers) -> None:
    """close() twice is fine, a hold open across it exits cleanly, and hold() afterwards fails."""
    closing = await managers.open_another()
    async with closing.hold("task") as held:
        assert held
        await closing.close()
    await closing.close()
    with pytest.raises(LockManagerClosedError):
        async with closing.hold("task"):
            pass


@pytest.mark.parametrize("backend", [POSTGRES], indirect=True)
async def test_postgres_lock_dies_with_the_holder_connection(
    managers: Managers, caplog: pytest.LogCaptureFixture
) -> None:
    """When the holder's connection dies, another manager takes its lock; the holder reconnects."""
    holder = managers.first
    assert isinstance(holder, PostgresLockManager)
    async with AsyncExitStack() as stack:
        async with holder.hold("task") as held:
            assert held
            admin = await asyncpg.connect(POSTGRES_URL)
            try:
                assert await admin.fetchval("SELECT pg_terminate_backend($1)", holder.server_pid)
            finally:
                await admin.close()
            await eventually_hold(managers.second, "task", stack)
        async with holder.hold("other") as other:
            assert other
        async with holder.hold("task") as retaken:
            assert not retaken
    assert "locks.connection_lost" in caplog.messages


OpenRedis = Callable[..., Awaitable[RedisLockManager]]


@pytest.fixture
async def open_redis(redis_url: str, namespace: str) -> AsyncIterator[OpenRedis]:
    """Opens Redis managers with a chosen TTL and renewal interval, closed after the test."""
    opened: list[RedisLockManager] = []

    async def open_manager(ttl_s: float, renew_interval_s: float | None = None) -> RedisLockManager:
        manager = await RedisLockManager.open(
            redis_url, prefix=namespace, ttl_s=ttl_s, renew_interval_s=renew_interval_s
        )
        opened.append(manager)
        return manager

    yield open_manager
    for manager in opened:
        await manager.close()


@pytest.mark.parametrize("backend", [REDIS], indirect=True)
async def test_redis_lock_expires_when_the_holder_stops_renewing(
    managers: Managers, open_redis: OpenRedis
) -> None:
    """A lock whose holder no longer renews it is free again after its TTL."""
    frozen = await open_redis(0.3, renew_interval_s=3600)
    async with frozen.hold("task") as held, AsyncExitStack() as stack:
        assert held
        await eventually_hold(managers.second, "task", stack)


@pytest.mark.parametrize("backend", [REDIS], indirect=True)
async def test_redis_renewal_keeps_a_long_hold_alive(
    managers: Managers, open_redis: OpenRedis
) -> None:
    """A hold lasting several TTLs keeps its lock, because renewal extends it."""
    ttl_s = 0.5
    holder = await open_redis(ttl_s)
    async with holder.hold("task") as held:
        assert held
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(3.2 * ttl_s, done.set)
        await asyncio.wait_for(done.wait(), DEADLINE_S)
        async with managers.second.hold("task") as other:
            assert not other


@pytest.mark.parametrize("backend", [REDIS], indirect=True)
async def test_redis_release_never_deletes_a_retaken_lock(
    managers: Managers, open_redis: OpenRedis
) -> None:
    """A holder whose lock expired and was re-taken leaves the new holder's lock alone."""
    frozen = await open_redis(0.3, renew_interval_s=3600)
    async with AsyncExitStack() as retaken:
        async with frozen.hold("task") as held:
            assert held
            await eventually_hold(managers.second, "task", retaken)
        # `frozen` has left its hold: the lock must still be the second manager's.
        async with frozen.hold("task") as again:
            assert not again


@pytest.mark.redis
async def test_redis_renewal_notices_a_lost_lock(
    open_redis: OpenRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Renewal logs locks.lost when the lock was taken over, and release leaves the new value."""
    holder = await open_redis(0.3)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        async with holder.hold("task") as held:
            assert held
            await client.set(holder.key("task"), "someone-else", px=60_000)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while "locks.lost" not in caplog.messages:
                assert loop.time() < deadline, "renewal did not notice the lost lock"
                await asyncio.sleep(0.02)
        assert await client.get(holder.key("task")) == b"someone-else"
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_redis_takeover_frees_only_the_same_owners_locks(
    redis_url: str, namespace: str
) -> None:
    """A manager restarted at its address frees the locks its predecessor (same owner, another
    process) left, leaves other owners' and other namespaces' locks alone, and names its own
    tokens after its owner; a second manager of another owner cannot take what it then holds."""
    client = aioredis.from_url(redis_url)
    restarted = await RedisLockManager.open(redis_url, prefix=namespace, ttl_s=30.0)
    other = await RedisLockManager.open(redis_url, prefix=namespace, ttl_s=30.0)
    outside = f"{namespace}-other:lock:task"
    try:
        await client.set(restarted.key("mine"), "host-a:8080/dead")
        await client.set(restarted.key("theirs"), "host-a:8081/alive")
        await client.set(restarted.key("prefix-only"), "host-a:80800/alive")
        await client.set(outside, "host-a:8080/dead")

        assert await restarted.take_over_predecessor("host-a:8080") == 1

        assert await client.get(restarted.key("mine")) is None
        assert await client.get(restarted.key("theirs")) == b"host-a:8081/alive"
        assert await client.get(restarted.key("prefix-only")) == b"host-a:80800/alive"
        assert await client.get(outside) == b"host-a:8080/dead"
        async with restarted.hold("mine") as hold:
            assert hold
            token = await client.get(restarted.key("mine"))
            assert token is not None and token.startswith(b"host-a:8080/")
            async with other.hold("mine") as elsewhere:
                assert not elsewhere
            with pytest.raises(RuntimeError, match="before any hold"):
                await restarted.take_over_predecessor("host-a:8080")
        with pytest.raises(ValueError, match="owner"):
            await other.take_over_predecessor("host/a")
    finally:
        await client.delete(outside)
        await restarted.close()
        await other.close()
        await client.aclose()


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("postgres", {}, "need postgres_dsn"),
        ("redis", {}, "need redis_url"),
        ("zookeeper", {}, "unknown lock kind"),
        ("postgres", {"postgres_dsn": "mysql://admin:s3cret@db/x"}, "'mysql' is not supported"),
    ],
)
async def test_factory_rejects_bad_arguments(
    kind: str, options: dict[str, str], message: str
) -> None:
    """open_lock_manager says what is missing or wrong, without echoing the DSN."""
    with pytest.raises(ValueError, match=message) as error:
        await open_lock_manager(kind, **options)  # type: ignore[arg-type]
    assert "s3cret" not in str(error.value)


def test_postgres_lock_keys_are_stable_signed_64_bit() -> None:
    """The advisory key depends only on prefix and name and fits PostgreSQL's bigint."""
    key = lock_key("corral", "schedule")
    assert key == lock_key("corral", "schedule") != lock_key("other", "schedule")
    assert -(2**63) <= key < 2**63
