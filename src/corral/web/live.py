"""The dashboard's live stream: what changed for each open page, slim and sent in batches.

A page only needs to know that something changed, so a frame carries an event's id, kind and
entity, not its payload. One `DashboardHub` per manager holds the only event-bus subscription
of all its open dashboards: it wakes for the first event of a batch, waits `BATCH_S`, takes
every event buffered meanwhile at once (`Subscription.drain`) and hands each open page its
chunk. A page of many things (the overview, the queue, a listing) gets one frame for the
batch, the newest event's with how many there were, worked out once per audience (an admin
sees every event, a user their own); a page of one entity (a session's, `?entity=`) gets each
of that entity's events. Per dashboard a busy manager so spends a few small writes a second,
whatever its events: each dashboard subscribing on its own, with every event pushed to each
and awaited alone, took more of the manager's time with 20 dashboards open than everything
else it did. Events the bus dropped are one "refresh" frame, never re-read; so is a page that
let its chunks pile up (a stalled browser).

A reconnecting page (`since`) first gets what it missed from the events table
(`DashboardStream`, an `api.events.EventStream` for its replay), then the hub's chunks; an
event in both makes the page refresh once more, never less.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

from corral.api.events import KEEPALIVE_S, EventStream, next_event
from corral.coordination.quarantine import Quarantine
from corral.domain.events import DROPPED_KIND, Event
from corral.infra.events import EventBus, EventBusError
from corral.store.database import Database
from corral.store.events import read_events

logger = logging.getLogger(__name__)

BATCH_S = 0.25  # events arriving within this are written together (the pages' extra latency)
REPLAY_CHUNK = 1000  # replayed frames written together, at most
QUEUED_CHUNKS = 64  # chunks a page may leave unread before they become one refresh frame

# The frame sent for events the bus dropped (a subscriber that fell behind): "refresh".
GAP_FRAME = "data: " + json.dumps({"id": None, "kind": DROPPED_KIND, "entity_id": None}) + "\n\n"


class Listener:
    """One open page at the hub: whose events it sees, and its chunks not yet written."""

    def __init__(self, owner: uuid.UUID | None, entity: str | None) -> None:
        self.owner = owner  # None: an admin, every event
        self.entity = entity  # None: a page of many things, one frame a batch
        self._chunks: deque[str] = deque()
        self._wakeup = asyncio.Event()
        self._ended = False

    def put(self, chunk: str) -> None:
        """Queue `chunk`; a page that left too many unread gets one refresh frame instead."""
        if len(self._chunks) >= QUEUED_CHUNKS:
            self._chunks.clear()
            chunk = GAP_FRAME
        self._chunks.append(chunk)
        self._wakeup.set()

    def end(self) -> None:
        """No more chunks will come (the bus failed or closed): the page reconnects."""
        self._ended = True
        self._wakeup.set()

    async def next(self, timeout_s: float) -> str | None:
        """Everything queued, as one chunk, once there is any; "" after `timeout_s` with
        nothing; None once ended and empty."""
        while not self._chunks:
            if self._ended:
                return None
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout_s)
            except TimeoutError:
                return ""
        chunk = "".join(self._chunks)
        self._chunks.clear()
        return chunk


class DashboardHub:
    """The one event-bus subscription of a manager's open dashboards, batched and fanned out
    to them as chunks (`Listener`). It subscribes when the first page opens and lets go when
    the last one closes."""

    def __init__(self, bus: EventBus, *, batch_s: float = BATCH_S) -> None:
        self.bus = bus
        self.batch_s = batch_s
        self._listeners: set[Listener] = set()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    @asynccontextmanager
    async def listen(self, owner: uuid.UUID | None, entity: str | None) -> AsyncIterator[Listener]:
        """A page's listener, registered (and the hub subscribed) before it is given: no
        event committed from then on is missed."""
        listener = Listener(owner, entity)
        self._listeners.add(listener)
        try:
            if self._task is None or self._task.done():
                self._ready = asyncio.Event()
                self._task = asyncio.create_task(self._run(self._ready), name="dashboard-hub")
            task = self._task
            await self._ready.wait()
            if task.done():  # it could not subscribe: the page reconnects
                listener.end()
            yield listener
        finally:
            self._listeners.discard(listener)
            if not self._listeners and self._task is not None:
                self._task.cancel()
                self._task = None

    async def _run(self, ready: asyncio.Event) -> None:
        try:
            async with self.bus.subscribe() as subscription:
                ready.set()
                while (first := await next_event(subscription)) is not None:
                    await self._gather()
                    self.deliver([first, *subscription.drain()])
        except EventBusError as exc:
            logger.warning("dashboard.hub_bus_failed", extra={"error": str(exc)})
        finally:
            ready.set()
            # Cancelled when the last page closed, a newer run may serve the pages since.
            if self._task is asyncio.current_task():
                for listener in list(self._listeners):
                    listener.end()

    async def _gather(self) -> None:
        """Let the batch that one event began gather the events following it."""
        await asyncio.sleep(self.batch_s)

    def deliver(self, events: list[Event]) -> None:
        """Each open page's chunk of a batch of `events`, each audience's worked out once."""
        gap = any(e.kind == DROPPED_KIND for e in events)
        real = [e for e in events if e.kind != DROPPED_KIND and e.id is not None]
        by_owner: dict[uuid.UUID | None, list[Event]] | None = None
        by_entity: dict[str, list[Event]] | None = None
        summaries: dict[uuid.UUID | None, str] = {}
        for listener in self._listeners:
            if listener.entity is None:
                if listener.owner not in summaries:
                    if listener.owner is None:
                        mine = real
                    else:
                        by_owner = by_owner if by_owner is not None else _group_by_owner(real)
                        mine = by_owner.get(listener.owner, [])
                    summaries[listener.owner] = summary_frame(mine)
                chunk = summaries[listener.owner]
            else:
                by_entity = by_entity if by_entity is not None else _group_by_entity(real)
                chunk = "".join(
                    slim_frame(e)
                    for e in by_entity.get(listener.entity, [])
                    if listener.owner is None or e.owner_id == listener.owner
                )
            if gap:
                chunk += GAP_FRAME
            if chunk:
                listener.put(chunk)


class DashboardStream(EventStream):
    """One open page's frames: what it missed since `since` (read from the events table,
    visible to its viewer), then the hub's chunks, a keep-alive comment when idle."""

    def __init__(
        self,
        db: Database,
        hub: DashboardHub,
        *,
        owner: uuid.UUID | None,
        entity_id: str | None,
        quarantine: Quarantine | None = None,
        allowed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        super().__init__(
            db,
            hub.bus,
            owner=owner,
            entity_id=entity_id,
            quarantine=quarantine,
            named=False,
            allowed=allowed,
        )
        self.hub = hub

    async def frames(self, since: int | None) -> AsyncGenerator[str, None]:
        async with self.hub.listen(self.owner, self.entity_id) as listener:
            yield ": connected\n\n"
            if since is not None:
                async for missed in self._replay(since):
                    yield missed
            quiet_since = time.monotonic()
            while (chunk := await listener.next(min(KEEPALIVE_S, self.recheck_s))) is not None:
                if not await self.still_allowed():
                    return  # signed out, expired or revoked: the page's reconnect is refused
                if chunk:
                    yield chunk
                elif time.monotonic() - quiet_since < KEEPALIVE_S:
                    continue
                else:
                    yield ": keep-alive\n\n"
                quiet_since = time.monotonic()

    async def _replay(self, after_id: int) -> AsyncGenerator[str, None]:
        """What a reconnecting page missed: a page of many things is told once that things
        changed (the newest of its viewer's events since, one read whatever their number); a
        page of one entity, each of its events, `REPLAY_CHUNK` frames to a write."""
        if self.entity_id is None:
            newest = await read_events(
                self.db, after_id=after_id, limit=1, owner_id=self.owner, newest=True
            )
            if newest:
                yield self._frame(newest[0])
            return
        frames: list[str] = []
        async for frame in super()._replay(after_id):
            frames.append(frame)
            if len(frames) >= REPLAY_CHUNK:
                yield "".join(frames)
                frames = []
        if frames:
            yield "".join(frames)

    def _data(self, event: Event) -> str:
        return _slim_data(event.id, event.kind, event.entity_id)


def summary_frame(events: list[Event]) -> str:
    """One frame for a batch's `events` ("" for none): the newest one's, with how many."""
    if not events:
        return ""
    newest = max(events, key=lambda e: e.id or 0)
    data = {"id": newest.id, "kind": newest.kind, "entity_id": newest.entity_id}
    data["events"] = len(events)
    return f"id: {newest.id}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def slim_frame(event: Event) -> str:
    """One event's frame: its id, kind and entity."""
    assert event.id is not None
    return _slim_frame(event.id, event.kind, event.entity_id)


def _group_by_owner(events: Iterable[Event]) -> dict[uuid.UUID | None, list[Event]]:
    grouped: dict[uuid.UUID | None, list[Event]] = {}
    for event in events:
        grouped.setdefault(event.owner_id, []).append(event)
    return grouped


def _group_by_entity(events: Iterable[Event]) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = {}
    for event in events:
        grouped.setdefault(event.entity_id, []).append(event)
    return grouped


def _slim_data(event_id: int | None, kind: str, entity_id: str | None) -> str:
    return json.dumps({"id": event_id, "kind": kind, "entity_id": entity_id}, separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def _slim_frame(event_id: int, kind: str, entity_id: str | None) -> str:
    """An event's frame, the same for every page that is sent it: encoded once."""
    return f"id: {event_id}\ndata: {_slim_data(event_id, kind, entity_id)}\n\n"
