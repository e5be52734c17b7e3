"""`GET /v1/events`: the audit log as Server-Sent Events, or as JSON pages (`follow=false`).

A user sees the events of what they own; admins see every event. The stream subscribes to the
event bus first and then replays the table after `since` (or the `Last-Event-ID` a reconnecting
EventSource sends), so nothing committed in between is lost; an event both replayed and
delivered live is sent once. Where the bus reports dropped events, the gap is re-read from the
table, which is the truth.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from corral.api._closing import until_closing
from corral.api._pages import (
    MAX_BIGINT,
    Cursor,
    Limit,
    Page,
    decode_cursor,
    json_without_unencodable,
    page_of,
)
from corral.api.auth import CurrentUser, Db, bearer, current_user
from corral.api.problems import Problem
from corral.controller.sessions import SessionController
from corral.coordination.quarantine import Quarantine
from corral.domain.events import DROPPED_KIND, Event
from corral.infra.events import EventBus, EventBusError, Subscription
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.tables import events as events_table

if TYPE_CHECKING:
    from corral.api.app import ApiContext

router = APIRouter(tags=["events"])
logger = logging.getLogger(__name__)

LISTING = "events"
SSE_MEDIA_TYPE = "text/event-stream"
KEEPALIVE_S = 15.0  # an idle stream sends a comment this often, so proxies keep it open
RECHECK_S = 15.0  # how often a stream asks whether its caller may still read it
REPLAY_BATCH = 1000
# Ids sent lately, to send an event both replayed and delivered live only once; a duplicate
# only ever comes from the short overlap around subscribing or a gap re-read.
SEEN_WINDOW = 10_000


class EventOut(BaseModel):
    """One change to one entity (`kind` e.g. "session.status_changed")."""

    id: int
    kind: str
    entity_type: str
    entity_id: str
    owner_id: uuid.UUID | None
    payload: dict[str, Any]
    created_at: datetime


class EventPage(Page[EventOut]):
    """A page of events; `next_cursor` fetches the next one."""


_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "follow=true (the default): a Server-Sent Events stream; "
        "follow=false: a JSON page of events",
        "model": EventPage,
        "content": {
            SSE_MEDIA_TYPE: {
                "schema": {
                    "type": "string",
                    "description": "Server-Sent Events: per event an `id: <event id>`, an "
                    "`event: <kind>` and a `data: <the event as JSON, as in EventOut>` line, "
                    "then a blank line; a `: keep-alive` comment while idle. A reconnecting "
                    "client sends `Last-Event-ID` and gets what it missed.",
                },
                "example": 'id: 42\nevent: session.status_changed\ndata: {"id": 42, '
                '"kind": "session.status_changed", ...}\n\n',
            }
        },
    }
}


@router.get("/v1/events", response_model=None, responses=_STREAM_DOC, operation_id="list_events")
async def events(
    request: Request,
    user: CurrentUser,
    token: Annotated[str, Depends(bearer)],
    db: Db,
    follow: Annotated[bool, Query(description="false: a JSON page instead of a stream")] = True,
    since: Annotated[
        int | None, Query(ge=0, le=MAX_BIGINT, description="only events after this id")
    ] = None,
    entity_id: Annotated[str | None, Query(max_length=64)] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    tail: Annotated[
        int | None,
        Query(ge=1, le=1000, description="follow=false: the last N events (oldest first)"),
    ] = None,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """The caller's events: live (and replayed after `since`), or a page (`follow=false`;
    with `tail`, the last events)."""
    owner = None if user.is_admin else user.user_id
    if since is None and last_event_id is not None:
        since = _event_id(last_event_id)
    if not follow and tail is not None:
        if cursor is not None:
            raise Problem(
                422,
                "validation-error",
                "The request is not valid",
                "tail: the last events come in one page, without a cursor",
                errors=[{"field": "tail", "message": "cannot be combined with cursor"}],
            )
        rows = await read_events(
            db, after_id=since or 0, limit=tail, owner_id=owner, entity_id=entity_id, newest=True
        )
        return _page_response(request, rows, None)
    if not follow:
        after = decode_cursor(LISTING, cursor, int)
        rows = await read_events(
            db,
            after_id=after if after is not None else since or 0,
            limit=limit + 1,
            owner_id=owner,
            entity_id=entity_id,
        )
        page = page_of(LISTING, rows, limit, lambda e: e.id or 0)
        return _page_response(request, page.items, page.next_cursor)
    context: ApiContext = request.app.state.context
    bus = context.events
    if bus is None:
        raise _unavailable("this manager runs without an event bus")
    try:
        # Fail here, as a problem, rather than after the stream's headers went out.
        async with bus.subscribe(maxsize=1):
            pass
    except EventBusError as exc:
        raise _unavailable(str(exc)) from exc

    async def allowed() -> bool:
        try:
            await current_user(request, token)
        except Problem:
            return False
        return True

    stream = EventStream(
        db,
        bus,
        owner=owner,
        entity_id=entity_id,
        quarantine=_quarantine(request),
        allowed=allowed,
    )
    return StreamingResponse(
        until_closing(stream.frames(since), context.closing),
        media_type=SSE_MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class EventStream:
    """One client's stream: replay after an id, then live events, each visible event once."""

    def __init__(
        self,
        db: Database,
        bus: EventBus,
        *,
        owner: uuid.UUID | None,
        entity_id: str | None,
        quarantine: Quarantine | None = None,
        named: bool = True,
        allowed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.db = db
        # Whether the caller may still read (its token or dashboard session not revoked nor
        # expired), asked every `RECHECK_S`: a stream whose caller may not ends.
        self.allowed = allowed
        self.recheck_s = RECHECK_S
        self._checked = time.monotonic()
        # False: frames without the `event:` line, so a browser's EventSource hands every one
        # to `onmessage` (the dashboard); the kind is in the data.
        self.named = named
        self.bus = bus
        self.quarantine = quarantine  # logs an event it cannot encode, once
        self.owner = owner  # None: an admin's stream, every event
        self.entity_id = entity_id
        self._seen: set[int] = set()
        self._floor = 0  # events at or below it were replayed or predate the stream

    async def frames(self, since: int | None) -> AsyncGenerator[str, None]:
        """SSE frames until the client goes away (or the bus closes)."""
        async with self.bus.subscribe() as subscription:
            # Subscribed: from here on nothing committed is missed.
            yield ": connected\n\n"
            if since is None:
                self._floor = await self._last_id()
            else:
                self._floor = since
                async with aclosing(self._replay(since)) as replayed:
                    async for frame in replayed:
                        yield frame
            async with aclosing(self._live(subscription)) as live:
                async for frame in live:
                    yield frame

    async def still_allowed(self) -> bool:
        """False once the caller may no longer read; asked at most every `recheck_s`."""
        if self.allowed is None or time.monotonic() - self._checked < self.recheck_s:
            return True
        self._checked = time.monotonic()
        return await self.allowed()

    async def _live(self, subscription: Subscription) -> AsyncGenerator[str, None]:
        pending = asyncio.ensure_future(next_event(subscription))
        quiet_since = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=min(KEEPALIVE_S, self.recheck_s))
                if not await self.still_allowed():
                    return
                if not done:
                    if time.monotonic() - quiet_since >= KEEPALIVE_S:
                        quiet_since = time.monotonic()
                        yield ": keep-alive\n\n"
                    continue
                quiet_since = time.monotonic()
                event = pending.result()
                if event is None:
                    return
                pending = asyncio.ensure_future(next_event(subscription))
                if event.kind == DROPPED_KIND:
                    async with aclosing(self._gap(event)) as filled:
                        async for frame in filled:
                            yield frame
                elif self._visible(event):
                    yield self._frame(event)
        finally:
            pending.cancel()

    async def _gap(self, marker: Event) -> AsyncGenerator[str, None]:
        """The frames for events the bus dropped (`marker`): read again from the database."""
        gap = marker.payload.get("after_id")
        logger.info("events.stream_gap", extra={"after_id": gap})
        start = self._floor if gap is None else max(int(gap), self._floor)
        async with aclosing(self._replay(start)) as replayed:
            async for frame in replayed:
                yield frame

    async def _replay(self, after_id: int) -> AsyncGenerator[str, None]:
        while True:
            batch = await read_events(
                self.db,
                after_id=after_id,
                limit=REPLAY_BATCH,
                owner_id=self.owner,
                entity_id=self.entity_id,
            )
            for event in batch:
                if event.id not in self._seen:
                    yield self._frame(event)
            if len(batch) < REPLAY_BATCH:
                return
            after_id = batch[-1].id or after_id

    def _visible(self, event: Event) -> bool:
        if event.id is None or event.id in self._seen:
            return False
        if self.owner is not None and event.owner_id != self.owner:
            return False
        return self.entity_id is None or event.entity_id == self.entity_id

    def _remember(self, event_id: int) -> None:
        """Note `event_id` as sent (a replayed event is not sent live again), in a window."""
        self._seen.add(event_id)
        if len(self._seen) > 2 * SEEN_WINDOW:
            self._seen = set(sorted(self._seen)[-SEEN_WINDOW:])

    def _frame(self, event: Event) -> str:
        assert event.id is not None
        self._remember(event.id)
        try:
            data = self._data(event)
        except (TypeError, ValueError) as exc:
            # One event no client can be sent: left out (nothing goes out for it), the stream
            # goes on.
            if self.quarantine is not None:
                self.quarantine.skipped(LISTING, event.id, exc)
            return ""
        if not self.named:
            return f"id: {event.id}\ndata: {data}\n\n"
        return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"

    def _data(self, event: Event) -> str:
        """A frame's `data:` text: the whole event as JSON (a subclass may send less)."""
        return event.to_json()

    async def _last_id(self) -> int:
        async with self.db.read() as conn:
            last = await conn.scalar(sa.select(sa.func.max(events_table.c.id)))
        return int(last or 0)


async def next_event(subscription: Subscription) -> Event | None:
    """The next live event; None once the bus closed (StopAsyncIteration cannot cross a task)."""
    try:
        return await anext(subscription)
    except StopAsyncIteration:
        return None
    except EventBusError as exc:
        logger.warning("events.stream_bus_failed", extra={"error": str(exc)})
        return None


def _quarantine(request: Request) -> Quarantine:
    sessions: SessionController = request.app.state.sessions
    return sessions.quarantine


def _page_response(request: Request, rows: Sequence[Event], next_cursor: str | None) -> Response:
    """A page of events as JSON; an event that cannot be encoded is left out, logged once."""

    def page(items: list[EventOut]) -> EventPage:
        return EventPage(items=items, next_cursor=next_cursor)

    quarantine = _quarantine(request)
    items: list[EventOut] = []
    for event in rows:
        try:
            items.append(_out(event))
        except (TypeError, ValueError) as exc:  # a payload that is no JSON object
            quarantine.skipped(LISTING, event.id, exc)
    body, unencodable = json_without_unencodable(items, page)
    for item in unencodable:
        quarantine.skipped(LISTING, item.id, "an event that cannot be encoded")
    return Response(body, media_type="application/json")


def _out(event: Event) -> EventOut:
    assert event.id is not None
    return EventOut(
        id=event.id,
        kind=event.kind,
        entity_type=event.entity_type,
        entity_id=event.entity_id,
        owner_id=event.owner_id,
        payload=dict(event.payload),
        created_at=event.created_at,
    )


def _event_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_BIGINT:
        raise Problem(
            422,
            "validation-error",
            "The request is not valid",
            f"Last-Event-ID: {text[:40]!r} is not an event id; send the `id:` of the last "
            "event received",
            errors=[{"field": "Last-Event-ID", "message": "not an event id"}],
        )
    return value


def _unavailable(why: str) -> Problem:
    return Problem(
        503,
        "event-stream-unavailable",
        "Event stream unavailable",
        f"live events are unavailable ({why}); read them with follow=false, paging with "
        "`since` or `cursor`, or try again later",
    )
