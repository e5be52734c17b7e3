"""Live events: fan appended events out to subscribers (the API's event stream, watchers).

The events table is the truth; a bus only makes changes visible at once. Delivery is best
effort and never blocks a publisher: a subscriber that falls behind, or a bus that lost its
connection, gets one "events.dropped" marker in the stream where events may be missing, and
re-reads that gap from the table with `read_events(after_id=marker.payload["after_id"])`.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from corral.domain.events import DROPPED_KIND, Event
from corral.infra._outage import OutageLog

if TYPE_CHECKING:
    from corral.store.database import Database

__all__ = [
    "DEFAULT_MAXSIZE",
    "PING_INTERVAL_S",
    "EventBus",
    "EventBusClosedError",
    "EventBusError",
    "EventBusKind",
    "Subscription",
    "forget_on_events",
    "open_event_bus",
    "publish_appended",
]

# How often a silent listener connection is pinged, unless the opener says otherwise.
PING_INTERVAL_S = 30.0
EventBusKind = Literal["memory", "postgres", "redis"]
DEFAULT_MAXSIZE = 10_000
_CANCEL_RETRY_S = 0.1
RESUBSCRIBE_S = 1.0  # after the event bus failed, before a watcher subscribes again

logger = logging.getLogger(__name__)


class EventBusError(RuntimeError):
    """The bus cannot deliver events: its listener died."""


class EventBusClosedError(EventBusError):
    """publish() or subscribe() was called on an EventBus after close()."""


class Subscription:
    """Live events for one subscriber, in arrival order, from a bounded buffer.

    A full buffer drops its oldest event rather than block anyone; the subscriber then gets
    one "events.dropped" marker (payload: reason, dropped, last_delivered_id, after_id) ahead of
    the events that were kept.
    """

    def __init__(
        self,
        source: str,
        maxsize: int = DEFAULT_MAXSIZE,
        *,
        kinds: Collection[str] | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError(f"a subscription needs room for at least one event, not {maxsize}")
        if kinds is not None and not kinds:
            raise ValueError("a subscription to no kinds of event would get nothing; give kinds")
        self._source = source
        self._maxsize = maxsize
        # The kinds of event this subscriber wants (None: all); the bus's markers always come.
        self.kinds: frozenset[str] | None = None if kinds is None else frozenset(kinds)
        self._buffer: deque[Event] = deque()
        self._dropped = 0
        self._overflowed = False
        # Smallest after_id that re-reads every dropped event (ids may arrive out of order).
        self._dropped_after: int | None = None
        self._last_delivered_id: int | None = None
        self._wakeup = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._overflowed:
                return self._overflow_marker()
            if self._buffer:
                event = self._buffer.popleft()
                if event.id is not None and event.kind != DROPPED_KIND:
                    self._last_delivered_id = event.id
                return event
            if self._error is not None:
                raise EventBusError(f"event bus {self._source!r} failed: {self._error!r}")
            if self._ended:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()

    def drain(self) -> list[Event]:
        """Every event buffered now, in order (an overflow marker first if events were
        dropped), without waiting; the end or an error of the bus comes from the next `anext`.
        """
        events = [self._overflow_marker()] if self._overflowed else []
        events.extend(self._buffer)
        self._buffer.clear()
        for event in reversed(events):
            if event.id is not None and event.kind != DROPPED_KIND:
                self._last_delivered_id = event.id
                break
        return events

    def push(self, event: Event) -> None:
        """Buffer `event` (never waits: a full buffer drops its oldest event)."""
        if len(self._buffer) >= self._maxsize:
            self._drop(self._buffer.popleft())
        self._buffer.append(event)
        self._wakeup.set()

    def push_gap(self, last_seen_id: int | None) -> None:
        """Mark that events may be missing after `last_seen_id` (the bus was disconnected)."""
        self.push(_marker(self._source, "reconnect", None, last_seen_id, last_seen_id))

    def end(self, error: BaseException | None = None) -> None:
        """Stop after the buffered events (raising EventBusError then, if `error` is given)."""
        self._ended = True
        self._error = error
        self._wakeup.set()

    def _drop(self, event: Event) -> None:
        self._overflowed = True
        if event.kind == DROPPED_KIND:
            after = event.payload.get("after_id")
        else:
            self._dropped += 1
            after = None if event.id is None else event.id - 1
        if after is not None:
            known = self._dropped_after
            self._dropped_after = after if known is None else min(known, after)

    def _overflow_marker(self) -> Event:
        last = self._last_delivered_id
        after = min((b for b in (self._dropped_after, last) if b is not None), default=None)
        marker = _marker(self._source, "overflow", self._dropped, last, after)
        self._overflowed, self._dropped, self._dropped_after = False, 0, None
        return marker


def _marker(
    source: str, reason: str, dropped: int | None, last_delivered: int | None, after: int | None
) -> Event:
    return Event(
        kind=DROPPED_KIND,
        entity_type="bus",
        entity_id=source,
        payload={
            "reason": reason,
            "dropped": dropped,  # None: unknown (the bus was disconnected)
            "last_delivered_id": last_delivered,
            "after_id": after,  # re-read the gap with read_events(after_id=...); None: unknown
        },
        created_at=datetime.now(UTC),
    )


class EventBus(ABC):
    """Fans appended events out to the live subscribers of every manager on one backend."""

    @property
    def commit_channel(self) -> str | None:
        """The PostgreSQL NOTIFY channel of this bus, where it has one (else None).

        Events appended with `append_events(..., notify=channel)` reach every subscriber
        through it when the appending transaction commits: they must not be published again.
        """
        return None

    # Failures of publish_after_commit, logged once per outage (made on first use).
    _after_commit: OutageLog | None = None

    @abstractmethod
    async def publish(self, events: Sequence[Event]) -> None:
        """Fan events out to live subscribers.

        Call it after the transaction that appended them committed, so a subscriber that
        re-reads the table finds them. Raises EventBusError when the bus is closed or its
        server cannot be reached.
        """

    async def publish_after_commit(self, events: Sequence[Event]) -> bool:
        """`publish` events whose change is committed; a failure is logged, not raised.

        The events are in the table whatever happens here (a subscriber that missed them
        reads them there, by id); raising would fail a request, or a coordinator run, whose
        change was made. Returns whether they went out. The first failure of an outage is a
        warning, the first success after it an info line.
        """
        outage = self._after_commit
        if outage is None:
            outage = self._after_commit = OutageLog(
                logger, "events.publish_failed", "events.publish_restored"
            )
        try:
            await self.publish(events)
        except EventBusError as exc:
            outage.failure({"events": len(events), "error": str(exc)})
            return False
        outage.success()
        return True

    @abstractmethod
    def subscribe(
        self, *, maxsize: int = DEFAULT_MAXSIZE, kinds: Collection[str] | None = None
    ) -> AbstractAsyncContextManager[Subscription]:
        """Live events from now on, until the context exits (buffering at most `maxsize`).

        With `kinds`, only events of those kinds (and the bus's own "events.dropped" markers):
        a subscriber that watches for a few kinds is not woken by every status change.
        """

    @abstractmethod
    async def close(self) -> None:
        """Idempotent; ends every subscription."""


class FanOutBus(EventBus):
    """The subscriber side every implementation shares: one buffer per subscription."""

    def __init__(self, prefix: str) -> None:
        if not prefix:
            raise ValueError("event bus prefix must not be empty; use e.g. 'corral'")
        self.prefix = prefix
        self._subscriptions: set[Subscription] = set()
        self._closed = False
        self._failure: BaseException | None = None

    @asynccontextmanager
    async def _subscribe(
        self, maxsize: int, kinds: Collection[str] | None
    ) -> AsyncIterator[Subscription]:
        self._check_open()
        if self._failure is not None:
            raise EventBusError(f"event bus {self.prefix!r} is broken: {self._failure!r}")
        subscription = Subscription(self.prefix, maxsize, kinds=kinds)
        self._subscriptions.add(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.discard(subscription)
            subscription.end()

    def subscribe(
        self, *, maxsize: int = DEFAULT_MAXSIZE, kinds: Collection[str] | None = None
    ) -> AbstractAsyncContextManager[Subscription]:
        return self._subscribe(maxsize, kinds)

    def _check_open(self) -> None:
        if self._closed:
            raise EventBusClosedError(f"event bus {self.prefix!r} is closed")

    def _wanted(self, kinds: Collection[str] | None) -> bool:
        """Whether a subscriber wants any of `kinds` (None: unknown, any kind)."""
        for subscription in self._subscriptions:
            wanted = subscription.kinds
            if wanted is None or kinds is None or not wanted.isdisjoint(kinds):
                return True
        return False

    def _deliver(self, events: Sequence[Event]) -> None:
        for subscription in self._subscriptions:
            wanted = subscription.kinds
            for event in events:
                if wanted is None or event.kind in wanted or event.kind == DROPPED_KIND:
                    subscription.push(event)

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        for subscription in self._subscriptions:
            subscription.end(error)

    def _end_subscriptions(self) -> None:
        self._closed = True
        for subscription in self._subscriptions:
            subscription.end()


async def publish_appended(bus: EventBus | None, events: Sequence[Event]) -> None:
    """Publish `events`, appended in a transaction that committed, unless the bus delivers
    them itself (its `commit_channel`: they were appended with `notify=` it) or there are
    none; a failure is logged (`EventBus.publish_after_commit`)."""
    if bus is not None and events and bus.commit_channel is None:
        await bus.publish_after_commit(events)


async def open_event_bus(
    kind: EventBusKind,
    *,
    prefix: str = "corral",
    db: Database | None = None,
    redis_url: str | None = None,
    ping_interval_s: float = PING_INTERVAL_S,
) -> EventBus:
    """Open the event bus of `kind`, listening and ready (a dead server fails here).

    A silent listener connection is pinged every `ping_interval_s` (a half-open TCP connection
    only shows itself to a query); a manager sets it to its long interval, so an idle manager
    sends nothing between long loops.
    """
    if kind == "memory":
        from corral.infra.events.memory import MemoryEventBus

        return MemoryEventBus(prefix)
    if kind == "postgres":
        if db is None or db.dialect != "postgresql":
            raise ValueError("the postgres event bus needs db, a Database on PostgreSQL")
        from corral.infra.events.postgres import PostgresEventBus

        return await PostgresEventBus.open(db, prefix=prefix, ping_interval_s=ping_interval_s)
    if kind == "redis":
        if redis_url is None:
            raise ValueError("the redis event bus needs redis_url (a redis://... URL)")
        from corral.infra.events.redis import RedisEventBus

        return await RedisEventBus.open(
            redis_url, db=db, prefix=prefix, ping_interval_s=ping_interval_s
        )
    raise ValueError(f"unknown event bus kind {kind!r}; use memory, postgres or redis")


async def forget_on_events(bus: EventBus, forget: Mapping[str, Callable[[], None]]) -> None:
    """Call `forget[kind]()` on each event of that kind, from any manager; until cancelled.

    For a process's caches of what another manager may change (API tokens, resource groups'
    options). Every forget is called when events may have been missed: on subscribing (what
    changed while nobody listened), on a dropped marker, and when the bus fails (after which
    this subscribes again). Returns when the bus is closed.
    """
    if not forget:
        return  # nothing to watch for
    forget_all = list(dict.fromkeys(forget.values()))

    def everything() -> None:
        for call in forget_all:
            call()

    while True:
        try:
            async with bus.subscribe(kinds=set(forget)) as subscription:
                everything()
                async for event in subscription:
                    if event.kind == DROPPED_KIND:
                        everything()
                    elif (call := forget.get(event.kind)) is not None:
                        call()
        except EventBusClosedError:
            return  # the manager is stopping
        except EventBusError as exc:
            everything()
            logger.warning("events.watch_unavailable", extra={"error": repr(exc)})
        await asyncio.sleep(RESUBSCRIBE_S)
