"""The dashboards' hub: one bus subscription for every open page; a batch's events go to each
page as one chunk (one frame for a page of many things, worked out per audience; each event
for a page of one entity), only the viewer's; a gap or a stalled page is one refresh frame;
the pages end when the bus does; the hub lets go when the last page closes."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from corral.domain.events import DROPPED_KIND, Event
from corral.infra.events import Subscription
from corral.infra.events.memory import MemoryEventBus
from corral.web.live import GAP_FRAME, QUEUED_CHUNKS, DashboardHub, Listener

ALICE, BOB = uuid.uuid4(), uuid.uuid4()
WAIT_S = 10.0  # a deadline for what must arrive, never a pause


def _event(event_id: int, owner: uuid.UUID = ALICE) -> Event:
    return Event(
        id=event_id,
        kind="session.status_changed",
        entity_type="session",
        entity_id=f"s-{event_id}",
        owner_id=owner,
        payload={"to": "RUNNING", "big": "x" * 100},
        created_at=datetime.now(UTC),
    )


def _data(chunk: str | None) -> list[dict[str, Any]]:
    assert chunk
    return [json.loads(line[6:]) for line in chunk.split("\n") if line.startswith("data: ")]


async def test_a_batch_is_one_frame_per_audience_and_each_entity_event_for_its_page() -> None:
    """Alice's list page, the admin's, and a page of Bob's session s-2: one bus subscription
    between them; one published batch gives Alice one frame of her two events (the newest),
    the admin one of all four, the session page only s-2's event, each with its `id:` line."""
    bus = MemoryEventBus("test")
    hub = DashboardHub(bus, batch_s=0)
    async with (
        hub.listen(ALICE, None) as alice,
        hub.listen(None, None) as admin,
        hub.listen(BOB, "s-2") as session_page,
    ):
        assert len(bus._subscriptions) == 1
        running = hub._task
        await bus.publish([_event(1, ALICE), _event(2, BOB), _event(4, ALICE), _event(3, BOB)])
        assert _data(await alice.next(WAIT_S)) == [
            {"id": 4, "kind": "session.status_changed", "entity_id": "s-4", "events": 2}
        ]
        assert [(f["id"], f["events"]) for f in _data(await admin.next(WAIT_S))] == [(4, 4)]
        chunk = await session_page.next(WAIT_S)
        assert _data(chunk) == [{"id": 2, "kind": "session.status_changed", "entity_id": "s-2"}]
        assert chunk is not None and chunk.startswith("id: 2\n")
    assert running is not None  # the last page closed: the hub lets go
    await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), WAIT_S)
    assert bus._subscriptions == set()


async def test_a_batch_of_others_events_sends_nothing_and_idle_is_a_keep_alive() -> None:
    """Bob's page is sent nothing for Alice's events: after the timeout, "" (a keep-alive)."""
    bus = MemoryEventBus("test")
    hub = DashboardHub(bus, batch_s=0)
    async with hub.listen(BOB, None) as bob, hub.listen(ALICE, None) as alice:
        await bus.publish([_event(1, ALICE)])
        assert _data(await alice.next(WAIT_S))[0]["id"] == 1
        assert await bob.next(0.01) == ""


def test_a_gap_is_a_refresh_frame_after_the_batch() -> None:
    """Events the bus dropped: the batch's frame, then one `events.dropped` frame."""
    hub = DashboardHub(MemoryEventBus("test"))
    listener = Listener(None, None)
    hub._listeners.add(listener)
    marker = Subscription("test", maxsize=1)
    for event_id in (1, 2):
        marker.push(_event(event_id))
    hub.deliver(marker.drain())
    chunk = listener._chunks[0]
    assert chunk.endswith(GAP_FRAME)
    assert [(f["id"], f.get("events")) for f in _data(chunk)] == [(2, 1), (None, None)]
    assert _data(chunk)[-1]["kind"] == DROPPED_KIND


async def test_a_page_that_stops_reading_gets_one_refresh_frame() -> None:
    """A stalled page's chunks pile up to the limit, then become one refresh frame (and
    what comes after it)."""
    listener = Listener(None, None)
    for _ in range(QUEUED_CHUNKS + 5):
        listener.put("data: {}\n\n")
    assert await listener.next(WAIT_S) == GAP_FRAME + "data: {}\n\n" * 4


async def test_the_pages_end_when_the_bus_closes_and_a_new_page_starts_it_again() -> None:
    """The bus closed: every open page's listener ends (the browser reconnects); a page
    opened later subscribes again."""
    bus = MemoryEventBus("test")
    hub = DashboardHub(bus, batch_s=0)
    async with hub.listen(None, None) as admin:
        await bus.close()
        assert await asyncio.wait_for(admin.next(WAIT_S), WAIT_S) is None
    reopened = MemoryEventBus("test")
    hub.bus = reopened
    async with hub.listen(None, None) as admin:
        await reopened.publish([_event(7)])
        assert _data(await admin.next(WAIT_S))[0]["id"] == 7


def test_drain_takes_everything_buffered_with_a_marker_first_after_an_overflow() -> None:
    """`drain` never waits: all buffered events in order, an overflow marker ahead of them
    (saying where the gap starts), then nothing."""
    subscription = Subscription("test", maxsize=3)
    for event_id in range(1, 6):
        subscription.push(_event(event_id))
    marker, *kept = subscription.drain()
    assert marker.kind == DROPPED_KIND and marker.payload["dropped"] == 2
    assert marker.payload["after_id"] == 0
    assert [e.id for e in kept] == [3, 4, 5]
    assert subscription.drain() == []
