"""The EventBus contract, run against the in-process, PostgreSQL and Redis buses."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa

from corral.domain.events import DROPPED_KIND, Event
from corral.infra.events import (
    EventBus,
    EventBusClosedError,
    EventBusError,
    Subscription,
    _listener,
    forget_on_events,
    open_event_bus,
)
from corral.infra.events.postgres import PostgresEventBus
from corral.infra.events.redis import RedisEventBus
from corral.store.database import Database
from corral.store.events import WHOLE_EVENTS_MAX, EventNotice, append_events
from tests.conftest import (
    REDIS_URL,
    UNREACHABLE_POSTGRES_URL,
    UNREACHABLE_REDIS_URL,
    require_server,
)

DEADLINE_S = 10.0
NOW = datetime(2030, 1, 1, tzinfo=UTC)
POSTGRES = pytest.param("postgres", marks=pytest.mark.postgres)
REDIS = pytest.param("redis", marks=pytest.mark.redis)
KINDS = ["memory", POSTGRES, REDIS]
LISTENING_KINDS = [POSTGRES, REDIS]

OpenBus = Callable[..., Awaitable[EventBus]]


def ev(n: int, **payload: object) -> Event:
    """Event number `n` (its id, and `n` in its payload)."""
    return Event(
        id=n,
        kind="session.status_changed",
        entity_type="session",
        entity_id=f"s-{n}",
        owner_id=uuid.UUID(int=n),
        payload={"n": n, **payload},
        created_at=NOW,
    )


async def take(subscription: Subscription, count: int) -> list[Event]:
    """The next `count` events of `subscription` (failing past the deadline)."""
    async with asyncio.timeout(DEADLINE_S):
        return [await anext(subscription) for _ in range(count)]


async def drain(subscription: Subscription) -> list[Event]:
    """Every event until the subscription ends (failing past the deadline)."""
    async with asyncio.timeout(DEADLINE_S):
        return [event async for event in subscription]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Which bus implementation the test runs against."""
    return str(request.param)


@pytest.fixture
async def pg_db(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Database | None]:
    """A fresh migrated PostgreSQL database for the postgres bus (None for the others)."""
    if kind != "postgres":
        yield None
        return
    db = Database.open(request.getfixturevalue("postgres_database_url"))
    yield db
    await db.close()


@pytest.fixture
async def open_bus(
    kind: str, pg_db: Database | None, redis_unreachable: str | None, namespace: str
) -> AsyncIterator[OpenBus]:
    """Opens buses of `kind` (default prefix: the test's namespace); all closed afterwards.

    In-process buses only share events within one bus object, so for memory every call with
    the same prefix returns the same bus.
    """
    if kind == "redis":
        require_server("Redis", redis_unreachable)
    opened: dict[str, EventBus] = {}
    buses: list[EventBus] = []

    async def open_(prefix: str = namespace) -> EventBus:
        if kind == "memory" and prefix in opened:
            return opened[prefix]
        bus = await open_event_bus(kind, prefix=prefix, db=pg_db, redis_url=REDIS_URL)  # type: ignore[arg-type]
        opened[prefix] = bus
        buses.append(bus)
        return bus

    yield open_
    for bus in buses:
        await bus.close()


async def test_subscriber_on_another_bus_gets_events_in_publish_order(open_bus: OpenBus) -> None:
    """Events published on bus A reach a subscriber of bus B, in publish order."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe() as subscription:
        await a.publish([ev(1), ev(2), ev(3)])
        await a.publish([])
        await a.publish([ev(4)])
        assert await take(subscription, 4) == [ev(1), ev(2), ev(3), ev(4)]


async def test_every_subscriber_gets_every_event(open_bus: OpenBus) -> None:
    """Two subscribers of one bus both receive all events."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe() as first, b.subscribe() as second:
        await a.publish([ev(1), ev(2)])
        assert await take(first, 2) == await take(second, 2) == [ev(1), ev(2)]


def revoked(n: int) -> Event:
    """Event number `n`, of another kind than `ev`'s."""
    return Event(
        id=n, kind="token.revoked", entity_type="token", entity_id=f"t-{n}", created_at=NOW
    )


async def test_a_subscriber_of_some_kinds_gets_only_those(open_bus: OpenBus) -> None:
    """`kinds` filters what a subscription gets; an unfiltered one still gets everything."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe(kinds={"token.revoked"}) as watcher, b.subscribe() as everything:
        await a.publish([ev(1), revoked(2), ev(3), revoked(4)])
        assert await take(everything, 4) == [ev(1), revoked(2), ev(3), revoked(4)]
        assert await take(watcher, 2) == [revoked(2), revoked(4)]
        await a.publish([ev(5), revoked(6)])
        # The next one it gets is 6: 5 (and 1, 3) never reached its buffer.
        assert await take(watcher, 1) == [revoked(6)]


async def test_a_subscription_to_no_kinds_is_refused(open_bus: OpenBus) -> None:
    bus = await open_bus()
    with pytest.raises(ValueError, match="no kinds"):
        async with bus.subscribe(kinds=[]):
            pass


async def test_a_watcher_of_nothing_returns_at_once(open_bus: OpenBus) -> None:
    """`forget_on_events` with nothing to forget has no kinds to subscribe to: it ends."""
    async with asyncio.timeout(DEADLINE_S):
        await forget_on_events(await open_bus(), {})


async def test_events_published_before_subscribing_are_not_delivered(open_bus: OpenBus) -> None:
    """A subscription starts with the first event the bus receives after it subscribed."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe() as witness:
        await a.publish([ev(1)])
        assert await take(witness, 1) == [ev(1)]  # so b has received ev(1)
        async with b.subscribe() as late:
            await a.publish([ev(2)])
            assert await take(late, 1) == [ev(2)]


async def test_slow_subscriber_keeps_the_newest_and_gets_one_dropped_marker(
    open_bus: OpenBus,
) -> None:
    """A full buffer drops the oldest events; one marker counts them and says where to re-read."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe() as fast, b.subscribe(maxsize=3) as slow:
        await a.publish([ev(n) for n in range(1, 11)])
        await take(fast, 10)  # so the slow subscriber has been offered all ten
        marker, *kept = await take(slow, 4)
        assert kept == [ev(8), ev(9), ev(10)]
        assert (marker.kind, marker.entity_type) == (DROPPED_KIND, "bus")
        assert marker.payload == {
            "reason": "overflow",
            "dropped": 7,
            "last_delivered_id": None,
            "after_id": 0,
        }
        await a.publish([ev(n) for n in range(11, 16)])
        await take(fast, 5)
        marker, *kept = await take(slow, 4)
        assert kept == [ev(13), ev(14), ev(15)]
        assert marker.payload["dropped"] == 2
        assert marker.payload["last_delivered_id"] == marker.payload["after_id"] == 10


async def test_close_ends_subscriptions_and_is_idempotent(open_bus: OpenBus) -> None:
    """close() stops a waiting iterator; a second close() is harmless; the bus refuses use."""
    b = await open_bus()
    async with b.subscribe() as subscription:
        waiting = asyncio.create_task(drain(subscription))
        await b.close()
        assert await waiting == []
        await b.close()
    with pytest.raises(EventBusClosedError):
        await b.publish([ev(1)])
    with pytest.raises(EventBusClosedError):
        async with b.subscribe():
            pass


async def test_prefixes_isolate_buses(open_bus: OpenBus, namespace: str) -> None:
    """A bus only gets the events published under its own prefix."""
    x_pub, x_sub = await open_bus(f"{namespace}-x"), await open_bus(f"{namespace}-x")
    y_pub, y_sub = await open_bus(f"{namespace}-y"), await open_bus(f"{namespace}-y")
    async with x_sub.subscribe() as on_x, y_sub.subscribe() as on_y:
        await x_pub.publish([ev(1)])
        await y_pub.publish([ev(2)])  # published after ev(1), so it would arrive after it
        assert await take(on_y, 1) == [ev(2)]
        assert await take(on_x, 1) == [ev(1)]


@pytest.mark.parametrize("kind", [POSTGRES])
async def test_large_events_arrive_whole(open_bus: OpenBus, pg_db: Database) -> None:
    """An event too large for a NOTIFY payload is fetched by id, keeping its place in order."""
    a, b = await open_bus(), await open_bus()
    big = Event(
        kind="route.health",
        entity_type="route",
        entity_id="r-1",
        payload={"log": "x" * 20_000, "nested": {"at": NOW}},
        created_at=NOW,
    )
    async with pg_db.transaction() as conn:
        appended = await append_events(conn, [ev(0), big, ev(0)], NOW)
    async with b.subscribe() as subscription:
        await a.publish(appended)
        assert await take(subscription, 3) == appended
    assert appended[1].payload["nested"] == {"at": NOW.isoformat()}
    with pytest.raises(ValueError, match="append it"):
        await a.publish([big])


@pytest.mark.parametrize("kind", [POSTGRES])
async def test_events_appended_with_the_commit_channel_arrive_at_commit(
    open_bus: OpenBus, pg_db: Database
) -> None:
    """PostgreSQL: the append itself notifies, whole or by id, in order, only if it commits."""
    a, b = await open_bus(), await open_bus()
    assert a.commit_channel is not None
    big = Event(
        kind="route.health",
        entity_type="route",
        entity_id="r-1",
        payload={"log": "x" * 20_000},
        created_at=NOW,
    )
    async with b.subscribe() as subscription:
        with pytest.raises(RuntimeError, match="rolled back"):
            async with pg_db.transaction() as conn:
                await append_events(conn, [ev(0)], NOW, notify=a.commit_channel)
                raise RuntimeError("rolled back")
        async with pg_db.transaction() as conn:
            appended = await append_events(
                conn, [ev(0, at=NOW), big, ev(0)], NOW, notify=a.commit_channel
            )
        assert await take(subscription, 3) == appended  # not the rolled-back one first
    assert appended[0].payload["at"] == NOW.isoformat()


@pytest.fixture
def reads(pg_db: Database) -> Iterator[list[str]]:
    """The statements that read events back for a notice, as the buses on `pg_db` run them."""
    seen: list[str] = []

    def count_reads(_conn: object, _cursor: object, sql: str, *_rest: object) -> None:
        if sql.startswith("SELECT events.") and "unnest" in sql:
            seen.append(sql)

    sa.event.listen(pg_db.engine.sync_engine, "before_cursor_execute", count_reads)
    yield seen
    sa.event.remove(pg_db.engine.sync_engine, "before_cursor_execute", count_reads)


@pytest.mark.parametrize("kind", [POSTGRES])
async def test_large_appends_notify_notices_read_only_when_wanted(
    open_bus: OpenBus, pg_db: Database, reads: list[str]
) -> None:
    """PostgreSQL: an append of many events NOTIFYs notices of their ids and kinds; a bus
    reads a notice's events from the table only when a subscriber of its wants one of those
    kinds, and delivers them in order."""
    a, b = await open_bus(), await open_bus()
    many = WHOLE_EVENTS_MAX + 1
    revoked = Event(
        kind="token.revoked", entity_type="token", entity_id="t-1", payload={}, created_at=NOW
    )
    async with b.subscribe(kinds={"token.revoked"}) as watcher, b.subscribe() as everything:
        async with pg_db.transaction() as conn:
            first = await append_events(conn, [ev(0)] * many, NOW, notify=a.commit_channel)
        async with pg_db.transaction() as conn:
            second = await append_events(
                conn, [ev(0)] * (many - 1) + [revoked], NOW, notify=a.commit_channel
            )
        assert await take(everything, 2 * many) == first + second
        assert await take(watcher, 1) == second[-1:]
    # b read both notices for `everything`; a, without subscribers, read nothing.
    assert len(reads) == 2
    async with b.subscribe(kinds={"token.revoked"}) as watcher:
        async with pg_db.transaction() as conn:
            await append_events(conn, [ev(0)] * many, NOW, notify=a.commit_channel)
        async with pg_db.transaction() as conn:
            [*_, last] = await append_events(
                conn, [ev(0)] * (many - 1) + [revoked], NOW, notify=a.commit_channel
            )
        assert await take(watcher, 1) == [last]
    assert len(reads) == 3  # only the notice naming a revoked token


@pytest.mark.parametrize("kind", [POSTGRES])
async def test_small_appends_notify_each_event_whole(
    open_bus: OpenBus, pg_db: Database, reads: list[str]
) -> None:
    """PostgreSQL: an append of a few events NOTIFYs each whole: a subscriber gets them
    without reading them back (no round trip added to a follower's latency)."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe() as subscription:
        async with pg_db.transaction() as conn:
            appended = await append_events(
                conn, [ev(0)] * WHOLE_EVENTS_MAX, NOW, notify=a.commit_channel
            )
        assert await take(subscription, WHOLE_EVENTS_MAX) == appended
    assert reads == []


@pytest.mark.parametrize("kind", ["memory", REDIS])
async def test_buses_without_a_commit_channel_say_so(open_bus: OpenBus) -> None:
    """Events on other buses must be published after the commit."""
    assert (await open_bus()).commit_channel is None


@pytest.mark.parametrize("kind", LISTENING_KINDS)
async def test_reconnect_delivers_a_dropped_marker_then_resumes(
    open_bus: OpenBus, kind: str, pg_db: Database | None, namespace: str
) -> None:
    """After losing its connection the bus reconnects, marks the gap, and delivers again."""
    a, b = await open_bus(), await open_bus()
    async with b.subscribe() as subscription, b.subscribe(kinds={"token.revoked"}) as watcher:
        await a.publish([ev(1)])
        assert await take(subscription, 1) == [ev(1)]
        await _sever_listeners(kind, pg_db, namespace)
        [marker] = await take(subscription, 1)
        # A subscriber of other kinds gets the marker too: it may have missed some of them.
        [watched] = await take(watcher, 1)
        assert (watched.kind, watched.payload["reason"]) == (DROPPED_KIND, "reconnect")
        assert marker.kind == DROPPED_KIND
        assert marker.payload == {
            "reason": "reconnect",
            "dropped": None,
            "last_delivered_id": 1,
            "after_id": 1,
        }
        await a.publish([ev(2)])
        assert await take(subscription, 1) == [ev(2)]


@pytest.mark.parametrize("kind", LISTENING_KINDS)
async def test_dead_listener_fails_subscriptions(
    open_bus: OpenBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that dies of an unexpected error ends subscriptions with EventBusError."""
    a, b = await open_bus(), await open_bus()

    def broken(cls: type[Event], data: object) -> Event:
        raise RuntimeError("decoder bug")

    async with b.subscribe() as subscription:
        # Every bus builds its events with `from_data` (`from_json` decodes, then calls it).
        monkeypatch.setattr(Event, "from_data", classmethod(broken))
        await a.publish([ev(1)])
        with pytest.raises(EventBusError, match="decoder bug"):
            await take(subscription, 1)
    with pytest.raises(EventBusError):
        async with b.subscribe():
            pass


async def _sever_listeners(kind: str, db: Database | None, namespace: str) -> None:
    """Cut the listening connections of this test's buses, server side."""
    if kind == "postgres":
        assert db is not None
        async with db.transaction() as conn:
            killed = await conn.scalar(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = 'corral-events'"
                )
            )
        assert killed == 2
        return
    client = aioredis.from_url(REDIS_URL)
    try:
        name = f"{namespace}:events"
        clients = await client.client_list(_type="pubsub")
        ids = [c["id"] for c in clients if c["name"] == name]
        assert len(ids) == 2
        for client_id in ids:
            await client.client_kill_filter(_id=client_id)
    finally:
        await client.aclose()


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_an_unreachable_server_fails_publish_as_an_event_bus_error(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused connection is an EventBusError; published after a commit, it is logged once
    per outage instead of raised (the events are in the table)."""
    db = Database.open(UNREACHABLE_POSTGRES_URL) if kind == "postgres" else None
    bus: EventBus = PostgresEventBus(db) if db is not None else RedisEventBus(UNREACHABLE_REDIS_URL)
    try:
        with pytest.raises(EventBusError, match="could not publish 1 events"):
            await bus.publish([ev(1)])
        assert not await bus.publish_after_commit([ev(2)])
        assert not await bus.publish_after_commit([ev(3)])
    finally:
        await bus.close()
        if db is not None:
            await db.close()
    assert caplog.messages.count("events.publish_failed") == 1


@pytest.mark.redis
async def test_redis_large_publishes_send_notices_read_only_when_wanted(
    db: Database, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis with a database: a publish of many appended events sends notices of their ids
    and kinds; a bus reads a notice's events from the table (SQLite or PostgreSQL) only when a
    subscriber of its wants one of those kinds, and delivers them in order."""
    reads: list[int] = []
    read = _listener.read_noticed_events

    async def counted(on: Database, notices: Sequence[EventNotice]) -> dict[int, Event]:
        reads.append(len(notices))
        return await read(on, notices)

    monkeypatch.setattr(_listener, "read_noticed_events", counted)
    a = await open_event_bus("redis", prefix=namespace, db=db, redis_url=redis_url)
    b = await open_event_bus("redis", prefix=namespace, db=db, redis_url=redis_url)
    many = WHOLE_EVENTS_MAX + 1
    revoked = Event(
        kind="token.revoked", entity_type="token", entity_id="t-1", payload={}, created_at=NOW
    )
    try:
        async with b.subscribe() as everything:
            async with db.transaction() as conn:
                first = await append_events(conn, [ev(0)] * many, NOW)
            await a.publish(first)
            assert await take(everything, many) == first
        assert reads == [1]  # b, for its subscriber; a has none
        async with b.subscribe(kinds={"token.revoked"}) as watcher:
            async with db.transaction() as conn:
                await a.publish(await append_events(conn, [ev(0)] * many, NOW))
            async with db.transaction() as conn:
                [whole] = await append_events(conn, [revoked], NOW)
            await a.publish([whole])  # a few events go whole
            assert await take(watcher, 1) == [whole]
        assert reads == [1]  # the second notice named no kind anyone wanted
    finally:
        await a.close()
        await b.close()
