"""The hint bus contract, pinned once and run against the memory, PostgreSQL and Redis buses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy as sa
from redis.asyncio import Redis

from corral.infra._redis import MAX_CONNECTIONS, redis_client
from corral.infra.hints import HintBus, HintBusError, HintBusKind, open_hint_bus
from corral.infra.hints.memory import MemoryHintBus, MemoryHintHub
from corral.infra.hints.postgres import (
    APPLICATION_NAME,
    PostgresHintBus,
    channel_name,
    listener_dsn,
)
from corral.infra.hints.redis import RedisHintBus
from corral.store.database import Database
from corral.store.tables import hints
from tests.conftest import UNREACHABLE_POSTGRES_URL, UNREACHABLE_REDIS_URL
from tests.integration._statements import recorded_statements

DEADLINE_S = 5.0  # generous: a prompt wake-up takes milliseconds
SHORT_S = 0.05  # a timeout under test, not a pause to wait for something
LONG_S = 60.0  # longer than DEADLINE_S, so a missed wake-up fails the deadline

POSTGRES = pytest.param("postgres", marks=pytest.mark.postgres)
REDIS = pytest.param("redis", marks=pytest.mark.redis)


@dataclass
class BusFactory:
    """Opens buses on one shared backend, as the managers of one cluster do."""

    kind: HintBusKind
    namespace: str
    db: Database | None
    redis_url: str | None
    _hub: MemoryHintHub = field(default_factory=MemoryHintHub)
    _opened: list[HintBus] = field(default_factory=list)

    async def __call__(self, prefix: str | None = None) -> HintBus:
        prefix = prefix or self.namespace
        bus: HintBus
        if self.kind == "memory":
            bus = MemoryHintBus(prefix=prefix, hub=self._hub)
        else:
            bus = await open_hint_bus(
                self.kind, prefix=prefix, db=self.db, redis_url=self.redis_url
            )
        self._opened.append(bus)
        return bus

    async def close(self) -> None:
        for bus in self._opened:
            await bus.close()
        if self.redis_url is not None:
            client = Redis.from_url(self.redis_url)
            try:
                keys = [key async for key in client.scan_iter(match=f"{self.namespace}*")]
                if keys:
                    await client.delete(*keys)
            finally:
                await client.aclose()


@pytest.fixture(params=["memory", POSTGRES, REDIS])
def backend(request: pytest.FixtureRequest) -> tuple[HintBusKind, str | None]:
    """The bus kind and its server's URL (resolved here, outside the event loop)."""
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("postgres_database_url")
    if request.param == "redis":
        return "redis", request.getfixturevalue("redis_url")
    return "memory", None


@pytest.fixture
async def bus_factory(
    backend: tuple[HintBusKind, str | None], namespace: str
) -> AsyncIterator[BusFactory]:
    """Opens buses sharing one backend; all are closed (and Redis keys removed) afterwards."""
    kind, url = backend
    db = Database.open(url) if kind == "postgres" and url else None
    factory = BusFactory(kind, namespace, db, url if kind == "redis" else None)
    try:
        yield factory
    finally:
        await factory.close()
        if db is not None:
            await db.close()


async def still_waiting(task: asyncio.Task[bool]) -> bool:
    """Whether `task` has not finished within SHORT_S (it is blocked, not merely slow to start)."""
    done, _ = await asyncio.wait({task}, timeout=SHORT_S)
    return not done


async def test_consume_takes_a_set_hint_exactly_once(bus_factory: BusFactory) -> None:
    """A set hint is consumed once; consuming it again, or an unset hint, gives False."""
    bus = await bus_factory()
    await bus.set("schedule")
    assert await bus.consume("schedule")
    assert not await bus.consume("schedule")
    assert not await bus.consume("terminate")


async def test_wait_sees_a_hint_already_set_and_times_out_otherwise(
    bus_factory: BusFactory,
) -> None:
    """A hint set before the wait (here or by another manager) counts; none set is a timeout."""
    setter, other = await bus_factory(), await bus_factory()
    assert not await other.wait(["schedule"], SHORT_S)
    await setter.set("schedule")
    assert await asyncio.wait_for(setter.wait(["schedule"], LONG_S), DEADLINE_S)
    assert await asyncio.wait_for(other.wait(["schedule"], LONG_S), DEADLINE_S)


async def test_set_on_another_bus_wakes_a_waiter(bus_factory: BusFactory) -> None:
    """A waiter is woken promptly by a set() from another manager."""
    waiter, setter = await bus_factory(), await bus_factory()
    waiting = asyncio.create_task(waiter.wait(["schedule"], LONG_S))
    assert await still_waiting(waiting)
    await setter.set("schedule")
    assert await asyncio.wait_for(waiting, DEADLINE_S)


async def test_wait_on_several_names_wakes_for_any(bus_factory: BusFactory) -> None:
    """A wait on several hints returns when any one of them is set."""
    waiter, setter = await bus_factory(), await bus_factory()
    waiting = asyncio.create_task(waiter.wait(["schedule", "terminate"], LONG_S))
    assert await still_waiting(waiting)
    await setter.set("terminate")
    assert await asyncio.wait_for(waiting, DEADLINE_S)
    assert not await waiter.wait(["schedule"], SHORT_S)


async def test_wait_never_clears(bus_factory: BusFactory) -> None:
    """Waiting leaves the hint set for the consumer."""
    first, second = await bus_factory(), await bus_factory()
    await first.set("schedule")
    for bus in (first, second, first):
        assert await bus.wait(["schedule"], DEADLINE_S)
    assert await second.consume("schedule")


async def test_concurrent_consumers_on_several_buses_get_one_true(bus_factory: BusFactory) -> None:
    """Of concurrent consumers across managers, exactly one gets a set hint."""
    buses = [await bus_factory() for _ in range(3)]
    for round_ in range(5):
        await buses[round_ % len(buses)].set("schedule")
        for bus in buses:  # every manager has heard of it before the race starts
            assert await bus.wait(["schedule"], DEADLINE_S)
        results = await asyncio.gather(*(bus.consume("schedule") for bus in buses * 2))
        assert results.count(True) == 1


async def test_close_is_idempotent_and_fails_pending_and_later_calls(
    bus_factory: BusFactory,
) -> None:
    """close() twice is fine; a pending wait and later calls raise HintBusError."""
    bus = await bus_factory()
    waiting = asyncio.create_task(bus.wait(["schedule"], LONG_S))
    assert await still_waiting(waiting)
    await bus.close()
    await bus.close()
    with pytest.raises(HintBusError, match="closed"):
        await asyncio.wait_for(waiting, DEADLINE_S)
    with pytest.raises(HintBusError, match="closed"):
        await bus.consume("schedule")


async def test_prefixes_isolate(bus_factory: BusFactory) -> None:
    """A hint set under one prefix is invisible under another on the same server."""
    mine, theirs = await bus_factory(), await bus_factory(f"{bus_factory.namespace}-other")
    await theirs.set("schedule")
    assert not await mine.wait(["schedule"], SHORT_S)
    assert not await mine.consume("schedule")
    assert await theirs.consume("schedule")


async def test_wait_rejects_a_bare_string(bus_factory: BusFactory) -> None:
    """wait("schedule") would wait on letters; it raises TypeError instead."""
    bus = await bus_factory()
    with pytest.raises(TypeError, match="collection"):
        await bus.wait("schedule", SHORT_S)


@pytest.mark.parametrize("backend", [POSTGRES, REDIS], indirect=True)
async def test_a_dead_listener_fails_waits_loudly(bus_factory: BusFactory) -> None:
    """When the listener task dies, a pending wait raises instead of hanging."""
    bus = await bus_factory()
    waiting = asyncio.create_task(bus.wait(["schedule"], LONG_S))
    assert await still_waiting(waiting)
    bus._listener_task.cancel()  # type: ignore[attr-defined]
    with pytest.raises(HintBusError, match="stopped"):
        await asyncio.wait_for(waiting, DEADLINE_S)


async def test_a_claimed_hint_set_here_stays_in_this_process(bus_factory: BusFactory) -> None:
    """While claimed, a hint set on this bus wakes its own waiter and is consumed here, once;
    another manager's bus never sees it."""
    bus, other = await bus_factory(), await bus_factory()
    bus.claim("schedule")
    waiter = asyncio.create_task(bus.wait(["schedule"], LONG_S))
    assert await still_waiting(waiter)
    await bus.set("schedule", "prepare")  # "prepare" is not claimed: it goes out as ever
    assert await asyncio.wait_for(waiter, DEADLINE_S)
    assert await other.wait(["prepare"], DEADLINE_S)
    assert not await other.wait(["schedule"], SHORT_S)
    assert await bus.consume("schedule")
    assert not await bus.consume("schedule")
    await bus.release("schedule")
    assert not await other.wait(["schedule"], SHORT_S)  # consumed: nothing left to send


async def test_releasing_a_claim_sends_a_hint_kept_under_it(bus_factory: BusFactory) -> None:
    """A kept hint nobody consumed is sent when the claim ends: no hint is lost."""
    bus, other = await bus_factory(), await bus_factory()
    bus.claim("schedule")
    await bus.set("schedule")
    await bus.release("schedule")
    assert await other.wait(["schedule"], DEADLINE_S)
    assert await other.consume("schedule")
    assert not await bus.consume("schedule")
    await bus.set("schedule")  # released: set goes to the server again
    assert await other.wait(["schedule"], DEADLINE_S)  # (PostgreSQL: once notified)
    assert await other.consume("schedule")


async def test_a_claimed_hint_set_by_another_manager_still_arrives(
    bus_factory: BusFactory,
) -> None:
    """A claim keeps only this process's hints: another manager's set wakes and is consumed."""
    bus, other = await bus_factory(), await bus_factory()
    bus.claim("schedule")
    waiter = asyncio.create_task(bus.wait(["schedule"], LONG_S))
    assert await still_waiting(waiter)
    await other.set("schedule")
    assert await asyncio.wait_for(waiter, DEADLINE_S)
    assert await bus.consume("schedule")
    assert not await other.consume("schedule")


@pytest.mark.parametrize("backend", [POSTGRES], indirect=True)
async def test_postgres_consume_and_wait_make_no_query_without_a_notification(
    bus_factory: BusFactory,
) -> None:
    """An idle postgres bus answers from its notifications, without querying the database."""
    assert bus_factory.db is not None
    bus, other = await bus_factory(), await bus_factory()
    # Right after connecting every hint may be set: the first check of each name queries.
    assert not await bus.consume("schedule")
    assert not await bus.wait(["terminate"], SHORT_S)
    with recorded_statements(bus_factory.db) as statements:
        for _ in range(3):
            assert not await bus.consume("schedule")
            assert not await bus.wait(["schedule", "terminate"], SHORT_S)
    assert statements == []
    await other.set("schedule")
    assert await bus.wait(["schedule"], DEADLINE_S)
    assert await bus.consume("schedule")


@pytest.mark.parametrize("backend", [POSTGRES], indirect=True)
async def test_postgres_bus_does_not_query_for_its_own_notifications(
    bus_factory: BusFactory,
) -> None:
    """A bus that set and consumed a hint knows it is gone: its own notification, arriving after
    the consume (as it does under load), does not make the next wait query; another bus's
    notification still wakes it."""
    assert bus_factory.db is not None
    bus, other = await bus_factory(), await bus_factory()
    assert isinstance(bus, PostgresHintBus)
    assert not await bus.consume("schedule")  # the first check after connecting queries
    await bus.set("schedule")
    assert await bus.consume("schedule")
    # Its own notification, replayed late, exactly as the listener hands it over.
    [payload] = await _notifications_of(bus, bus_factory.db, "schedule")
    bus._on_notification(None, 0, "", payload)
    with recorded_statements(bus_factory.db) as statements:
        assert not await bus.wait(["schedule"], SHORT_S)
    assert statements == []
    await other.set("schedule")
    assert await bus.wait(["schedule"], DEADLINE_S)
    assert await bus.consume("schedule")


async def _notifications_of(bus: PostgresHintBus, db: Database, name: str) -> list[str]:
    """The payloads `bus` sends when it sets `name`, as a listener of its channel hears them."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(listener_dsn(db))
    try:
        channel = channel_name(bus_prefix(bus))
        await listener.add_listener(channel, lambda *args: heard.put_nowait(args[-1]))
        await bus.set(name)
        payload = await asyncio.wait_for(heard.get(), DEADLINE_S)
    finally:
        await listener.close()
    assert await bus.consume(name)
    return [payload]


def bus_prefix(bus: PostgresHintBus) -> str:
    """The prefix `bus` was opened with."""
    return bus._prefix


@pytest.mark.parametrize("backend", [POSTGRES], indirect=True)
async def test_postgres_hint_set_unheard_is_found_after_reconnecting(
    bus_factory: BusFactory,
) -> None:
    """A hint whose notification nobody heard is found after the listener (re)connects."""
    db = bus_factory.db
    assert db is not None
    first = await bus_factory()
    await first.set("schedule")
    await first.close()
    late = await bus_factory()
    assert await late.consume("schedule")

    assert not await late.consume("terminate")
    async with db.transaction() as conn:
        killed = await conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = :app"
            ),
            {"app": APPLICATION_NAME},
        )
        assert any(killed.scalars())
        # Written without NOTIFY: only the reconnected listener's "maybe set" can find it.
        await conn.execute(
            hints.insert().values(name=f"{bus_factory.namespace}:terminate", set_at=sa.func.now())
        )
    assert await late.wait(["terminate"], DEADLINE_S)
    assert await late.consume("terminate")


@pytest.mark.parametrize("backend", [REDIS], indirect=True)
async def test_redis_hint_survives_without_subscribers(bus_factory: BusFactory) -> None:
    """A hint set while no other manager listens is still there for a later one."""
    first = await bus_factory()
    await first.set("schedule")
    await first.close()
    late = await bus_factory()
    assert await late.wait(["schedule"], DEADLINE_S)
    assert await late.consume("schedule")


async def test_open_hint_bus_explains_missing_arguments(tmp_path: Path) -> None:
    """The factory names the argument a kind needs, and refuses unknown kinds and SQLite."""
    with pytest.raises(ValueError, match="db="):
        await open_hint_bus("postgres")
    with pytest.raises(ValueError, match="redis_url"):
        await open_hint_bus("redis")
    with pytest.raises(ValueError, match="unknown hint bus kind"):
        await open_hint_bus("nats")  # type: ignore[arg-type]
    sqlite = Database.open(f"sqlite:///{tmp_path / 'corral.db'}")
    try:
        with pytest.raises(ValueError, match="PostgreSQL"):
            await open_hint_bus("postgres", db=sqlite)
    finally:
        await sqlite.close()
    memory = await open_hint_bus("memory")
    assert isinstance(memory, MemoryHintBus)
    await memory.close()


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_an_unreachable_server_fails_calls_as_hint_bus_errors(
    kind: HintBusKind, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused connection is a HintBusError (the one error callers handle), and a hint set
    after a commit is logged once per outage instead of raised."""
    db = Database.open(UNREACHABLE_POSTGRES_URL) if kind == "postgres" else None
    bus: HintBus = (
        PostgresHintBus(db) if db is not None else RedisHintBus(redis_client(UNREACHABLE_REDIS_URL))
    )
    try:
        with pytest.raises(HintBusError, match="could not set hints"):
            await bus.set("schedule")
        if isinstance(bus, RedisHintBus):  # the PostgreSQL bus answers these without a query
            with pytest.raises(HintBusError, match="could not consume"):
                await bus.consume("schedule")
            with pytest.raises(HintBusError, match="could not look hints up"):
                await bus.wait(["schedule"], SHORT_S)
        assert not await bus.set_after_commit("schedule")
        assert not await bus.set_after_commit("prepare")
    finally:
        await bus.close()
        if db is not None:
            await db.close()
    assert caplog.messages.count("hints.set_failed") == 1


@pytest.mark.parametrize("backend", [REDIS], indirect=True)
async def test_a_burst_of_sets_waits_for_redis_connections_instead_of_failing(
    bus_factory: BusFactory,
) -> None:
    """More concurrent sets than the client's pool holds (a thousand agents registering at
    once): each waits for a free connection; redis-py's default pool refused the 101st."""
    bus = await bus_factory()
    await asyncio.gather(*(bus.set(f"hint-{i}") for i in range(4 * MAX_CONNECTIONS)))
    assert await bus.consume(f"hint-{4 * MAX_CONNECTIONS - 1}")
