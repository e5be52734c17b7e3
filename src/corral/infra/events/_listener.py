"""The listening half of the server-backed event buses: one supervised listener task."""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from corral.domain.events import Event
from corral.infra._backoff import reconnect_delays
from corral.infra.events import _CANCEL_RETRY_S, FanOutBus
from corral.store.events import EventNotice, read_noticed_events

if TYPE_CHECKING:
    from corral.store.database import Database

logger = logging.getLogger("corral.infra.events")

_Conn = TypeVar("_Conn")


class ListeningBus(FanOutBus, Generic[_Conn]):
    """A bus fed by one supervised listener task on a server connection, reconnecting with
    backoff; after a reconnect every subscription gets a "reconnect" events.dropped marker.

    Subclasses say how to connect (listening once it returns), how to pump one connection
    (deliver until it is lost, then return or raise one of `transient_errors`) and disconnect.
    """

    transient_errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)

    def __init__(self, prefix: str, *, backoff_base_s: float, backoff_cap_s: float) -> None:
        super().__init__(prefix)
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._connection: _Conn | None = None
        self._listener: asyncio.Task[None] | None = None
        self._last_seen_id: int | None = None

    @abstractmethod
    async def _connect(self) -> _Conn: ...

    @abstractmethod
    async def _pump(self, connection: _Conn) -> None: ...

    @abstractmethod
    async def _disconnect(self, connection: _Conn) -> None: ...

    async def _start(self) -> None:
        self._connection = await self._connect()
        self._listener = asyncio.create_task(self._listen(), name=f"events-listener-{self.prefix}")
        self._listener.add_done_callback(self._listener_done)

    def _deliver(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.id is not None:
                self._saw(event.id)
        super()._deliver(events)

    async def _decode(self, db: Database | None, payloads: Sequence[str | bytes]) -> list[Event]:
        """The events of these messages, in order. A message is an event's JSON, or a notice
        of appended events (`EventNotice`): its events are read from `db` if a subscriber wants
        one of its kinds, else only noted as seen."""
        decoded: list[Event | EventNotice] = []
        for payload in payloads:
            try:
                data = json.loads(payload)
                decoded.append(
                    EventNotice.from_data(data) if "ids" in data else Event.from_data(data)
                )
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                logger.error(
                    "events.bad_notification",
                    extra={"bus": self.prefix, "error": type(exc).__name__, "size": len(payload)},
                )
        wanted = [
            item for item in decoded if isinstance(item, EventNotice) and self._wanted(item.kinds)
        ]
        if wanted and db is None:
            logger.error("events.notice_unreadable", extra={"bus": self.prefix})
            wanted = []
        fetched = await read_noticed_events(db, wanted) if db is not None and wanted else {}
        read = {id(notice) for notice in wanted}
        ids = sorted(fetched)
        events: list[Event] = []
        for item in decoded:
            if isinstance(item, Event):
                events.append(item)
            elif id(item) not in read:
                self._saw(item.last_id)
            else:
                found = [
                    fetched[i]
                    for first, last in item.runs
                    for i in ids[bisect.bisect_left(ids, first) : bisect.bisect_right(ids, last)]
                ]
                if len(found) < item.count:
                    logger.error(
                        "events.rows_missing",
                        extra={"bus": self.prefix, "missing": item.count - len(found)},
                    )
                self._saw(item.last_id)
                events.extend(found)
        return events

    def _saw(self, event_id: int) -> None:
        """Note an event as seen (delivered, or passed over as no subscriber wanted it)."""
        if (self._last_seen_id or 0) < event_id:
            self._last_seen_id = event_id

    async def _listen(self) -> None:
        while True:
            assert self._connection is not None
            lost: BaseException | None = None
            try:
                await self._pump(self._connection)
            except self.transient_errors as exc:
                lost = exc
            logger.warning("events.listener_lost", extra=self._log_fields(lost))
            await self._disconnect_quietly()
            self._connection = await self._reconnect()
            logger.info("events.listener_reconnected", extra=self._log_fields())
            for subscription in self._subscriptions:
                subscription.push_gap(self._last_seen_id)

    async def _reconnect(self) -> _Conn:
        delays = reconnect_delays(self._backoff_base_s, self._backoff_cap_s)
        attempt = 0
        while True:
            await asyncio.sleep(next(delays))
            try:
                return await self._connect()
            except self.transient_errors as exc:
                logger.warning("events.reconnect_failed", extra=self._log_fields(exc, attempt))
                attempt += 1

    def _listener_done(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            logger.error("events.listener_died", extra=self._log_fields(error), exc_info=error)
            self._fail(error)

    async def _disconnect_quietly(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await self._disconnect(connection)
            except self.transient_errors as exc:
                logger.info("events.disconnect_failed", extra=self._log_fields(exc))

    def _log_fields(
        self, error: BaseException | None = None, attempt: int | None = None
    ) -> dict[str, object]:
        # The error's class only: connection errors can quote addresses; URLs are never logged.
        fields: dict[str, object] = {"bus": self.prefix}
        if error is not None:
            fields["error"] = type(error).__name__
        if attempt is not None:
            fields["attempt"] = attempt
        return fields

    async def _stop_listening(self) -> None:
        """Stop the listener and its connection, end every subscription (idempotent)."""
        self._end_subscriptions()
        # Cancel until it ends: on Python 3.11, asyncio.wait_for (inside redis-py and asyncpg)
        # swallows a cancellation that lands as the awaited call completes.
        while self._listener is not None and not self._listener.done():
            self._listener.cancel()
            await asyncio.wait([self._listener], timeout=_CANCEL_RETRY_S)
        await self._disconnect_quietly()
