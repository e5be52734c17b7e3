"""`GET /v1/events` as Server-Sent Events and as JSON pages, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from corral.api import events as api_events
from corral.api import events as events_api
from corral.api.app import ApiContext, create_app
from corral.domain.events import DROPPED_KIND, Event
from corral.domain.spec import SessionSpec
from corral.domain.types import SessionId, UserId
from corral.store.events import append_events
from corral.store.tables import events as events_table
from tests.integration.api.conftest import ApiWorld
from tests.integration.api.test_admin_routes import problem
from tests.integration.store._factories import NOW

DEADLINE_S = 10.0
Frame = dict[str, str]  # the fields of one SSE frame: id, event, data


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Like httpx.ASGITransport, but hands the body over as the app sends it (endless streams).

    Closing a response tells the app the client went away, then waits for the app to finish:
    a stream that does not end when its client leaves fails the test.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = b"".join([part async for part in request.stream])  # type: ignore[union-attr]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": ("127.0.0.1", 123),
            "root_path": "",
        }
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        started: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        gone = asyncio.Event()
        request_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal request_sent
            if not request_sent:
                request_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started.set_result((message["status"], list(message.get("headers", []))))
            elif message["type"] == "http.response.body" and message.get("body"):
                chunks.put_nowait(message["body"])

        app = asyncio.create_task(self.app(scope, receive, send))
        app.add_done_callback(lambda _: chunks.put_nowait(None))
        await asyncio.wait({started, app}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            app.result()  # the app's error, if it failed before answering
            raise AssertionError("the app ended without answering")
        status, headers = started.result()
        return httpx.Response(status, headers=headers, stream=_Body(chunks, gone, app))


class _Body(httpx.AsyncByteStream):
    def __init__(self, chunks: asyncio.Queue[bytes | None], gone: asyncio.Event, app: Any) -> None:
        self.chunks, self.gone, self.app = chunks, gone, app

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self.chunks.get()) is not None:
            yield chunk

    async def aclose(self) -> None:
        self.gone.set()
        await asyncio.wait_for(asyncio.shield(self.app), DEADLINE_S)


@pytest.fixture
def context(world: ApiWorld) -> ApiContext:
    """The world's context: its database, controllers and event bus."""
    return ApiContext(
        db=world.cluster.db,
        agents=world.agents,
        sessions=world.cluster.controller,
        events=world.cluster.events,
    )


@pytest.fixture
async def http(context: ApiContext) -> AsyncIterator[httpx.AsyncClient]:
    """A streaming client on an app over the world's context."""
    transport = StreamingASGITransport(create_app(context))
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as client:
        yield client


@asynccontextmanager
async def stream(
    http: httpx.AsyncClient, headers: dict[str, str], **params: Any
) -> AsyncIterator[AsyncIterator[str]]:
    """The lines of an event stream, once the server has subscribed."""
    async with http.stream("GET", "/v1/events", params=params, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.aiter_lines()
        assert await anext(lines) == ": connected"
        yield lines


async def frames_until(
    lines: AsyncIterator[str], done: Callable[[list[Frame]], bool]
) -> list[Frame]:
    """Frames read until `done` says enough (a deadline, not a sleep, bounds the wait)."""
    frames: list[Frame] = []
    frame: Frame = {}
    async with asyncio.timeout(DEADLINE_S):
        async for line in lines:
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                frame[name] = value
                continue
            if frame:
                frames.append(frame)
                frame = {}
                if done(frames):
                    return frames
    raise AssertionError(f"the stream ended after {frames}")


def seen(*entity_ids: str) -> Callable[[list[Frame]], bool]:
    """Done once an event of each of these entities arrived."""
    return lambda frames: set(entity_ids) <= {json.loads(f["data"])["entity_id"] for f in frames}


async def enqueue(world: ApiWorld, owner: UserId) -> SessionId:
    """A session submitted for `owner` (its `session.created` event is published)."""
    spec = SessionSpec.model_validate({"image": "python", "command": ["true"]})
    return (await world.cluster.controller.enqueue(spec, owner)).session_id


async def last_event_id(world: ApiWorld) -> int:
    async with world.cluster.db.read() as conn:
        return int(await conn.scalar(sa.select(sa.func.max(events_table.c.id))) or 0)


async def test_user_sees_own_events_and_admin_sees_all(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """Alice's stream carries only her sessions' events; the admin's carries everyone's."""
    async with (
        stream(http, world.alice.headers) as alice,
        stream(http, world.admin.headers) as admin,
    ):
        bobs = str(await enqueue(world, world.bob.user.user_id))
        alices = str(await enqueue(world, world.alice.user.user_id))
        mine = await frames_until(alice, seen(alices))
        everyone = await frames_until(admin, seen(alices, bobs))
    assert {json.loads(f["data"])["entity_id"] for f in mine} == {alices}
    assert all(f["event"] == "session.created" for f in mine + everyone)
    assert [int(f["id"]) for f in everyone] == sorted(int(f["id"]) for f in everyone)


async def test_since_replays_stored_events_then_live_ones_once(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """A reconnecting client gets what it missed from the table, then live events, no twice."""
    before = await last_event_id(world)
    missed = str(await enqueue(world, world.alice.user.user_id))
    # Stored but not yet published: replayed, then delivered live too, and sent only once.
    async with world.cluster.db.transaction() as conn:
        (late,) = await append_events(conn, [_event("late", world.alice.user.user_id)], NOW)
    async with stream(http, world.alice.headers, since=before) as lines:
        replayed = await frames_until(lines, seen(missed, "late"))
        await world.cluster.events.publish([late])
        live = str(await enqueue(world, world.alice.user.user_id))
        rest = await frames_until(lines, seen(live))
    ids = [int(f["id"]) for f in replayed + rest]
    assert len(ids) == len(set(ids)) == 3 and ids == sorted(ids)


async def test_last_event_id_header_resumes_like_since(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """An EventSource's `Last-Event-ID` replays what came after it."""
    before = await last_event_id(world)
    missed = str(await enqueue(world, world.alice.user.user_id))
    headers = {**world.alice.headers, "Last-Event-ID": str(before)}
    async with stream(http, headers) as lines:
        (frame,) = await frames_until(lines, seen(missed))
    assert int(frame["id"]) > before
    bad = {**world.alice.headers, "Last-Event-ID": "yesterday"}
    async with http.stream("GET", "/v1/events", headers=bad) as response:
        await response.aread()
    problem(response, 422, "validation-error")


async def test_dropped_events_are_reread_from_the_table(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """After the bus says it dropped events, the stream re-reads the gap, sending none twice."""
    async with stream(http, world.admin.headers) as lines:
        after = await last_event_id(world)
        delivered = str(await enqueue(world, world.alice.user.user_id))
        await frames_until(lines, seen(delivered))
        async with world.cluster.db.transaction() as conn:
            await append_events(conn, [_event("lost-in-transit", None)], NOW)
        marker = Event(
            kind=DROPPED_KIND,
            entity_type="bus",
            entity_id="test",
            payload={"reason": "overflow", "dropped": 1, "after_id": after},
            created_at=NOW,
        )
        await world.cluster.events.publish([marker])
        (frame,) = await frames_until(lines, seen("lost-in-transit"))
    assert frame["event"] == "test.happened"


async def test_idle_stream_sends_keep_alives(
    world: ApiWorld, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle stream sends `: keep-alive` comments, and ends when its client leaves."""
    monkeypatch.setattr(events_api, "KEEPALIVE_S", 0.01)
    async with stream(http, world.alice.headers) as lines, asyncio.timeout(DEADLINE_S):
        assert await anext(lines) == ""  # the end of the `: connected` frame
        assert await anext(lines) == ": keep-alive"
    # Leaving the block closed the response, which waits until the app has ended.


async def test_stream_needs_a_token_and_a_bus(
    world: ApiWorld, http: httpx.AsyncClient, context: ApiContext
) -> None:
    """No or a bad token is a 401 problem; without an event bus the stream is a 503 problem."""
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = await http.get("/v1/events", headers=headers)
        problem(response, 401, "unauthenticated")
    app = create_app(ApiContext(db=context.db, agents=context.agents, sessions=context.sessions))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://manager"
    ) as plain:
        response = await plain.get("/v1/events", headers=world.alice.headers)
        problem(response, 503, "event-stream-unavailable")
        page = await plain.get("/v1/events?follow=false", headers=world.alice.headers)
        assert page.status_code == 200


async def test_event_pages_are_filtered_and_walk_every_event_once(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """`follow=false` pages hold the caller's events only, each once, oldest first."""
    alices = {str(await enqueue(world, world.alice.user.user_id)) for _ in range(5)}
    bobs = str(await enqueue(world, world.bob.user.user_id))
    for caller, expected in ((world.alice, alices), (world.admin, {*alices, bobs})):
        params: dict[str, Any] = {"follow": "false", "limit": 2}
        items: list[dict[str, Any]] = []
        while True:
            page = (await http.get("/v1/events", params=params, headers=caller.headers)).json()
            items += page["items"]
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
        ids = [e["id"] for e in items]
        assert ids == sorted(set(ids))
        assert {e["entity_id"] for e in items if e["entity_type"] == "session"} >= expected
        if caller is world.alice:
            assert {e["entity_id"] for e in items} == alices
    one = await http.get(
        "/v1/events", params={"follow": "false", "entity_id": bobs}, headers=world.bob.headers
    )
    assert [e["entity_id"] for e in one.json()["items"]] == [bobs]


def _event(entity_id: str, owner: UserId | None) -> Event:
    return Event(
        kind="test.happened",
        entity_type="test",
        entity_id=entity_id,
        owner_id=owner,
        created_at=NOW,
    )


async def test_a_stream_ends_once_its_token_is_revoked(
    world: ApiWorld, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Carol follows her events; an admin revokes her token: her open stream ends (at the
    next check, here made frequent), and reconnecting is refused."""
    monkeypatch.setattr(api_events, "RECHECK_S", 0.05)
    admin = world.admin.headers
    created = await http.post("/v1/users", json={"name": "carol", "role": "user"}, headers=admin)
    assert created.status_code == 201, created.text
    issued = (await http.post("/v1/users/carol/tokens", json={"name": "t"}, headers=admin)).json()
    carol = {"Authorization": f"Bearer {issued['token']}"}
    async with stream(http, carol) as lines:
        gone = await http.delete(f"/v1/tokens/{issued['id']}", headers=admin)
        assert gone.status_code == 204
        async with asyncio.timeout(DEADLINE_S):
            async for _ in lines:  # until the stream ends by itself (the revocation's own
                pass  # event, owned by carol, may still come first)
    refused = await http.get("/v1/events", headers=carol)
    assert refused.status_code == 401
