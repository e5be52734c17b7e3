"""`GET /ui/stream`: the page's live events, by the cookie, each a plain SSE message."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from corral.api import events as api_events
from corral.api.app import ApiContext, create_app
from corral.domain.types import SessionId
from corral.web._render import DASHBOARDS_HEADER
from corral.web.auth import CSRF_FIELD
from corral.web.live import DashboardHub
from tests.integration.api.conftest import ApiWorld
from tests.integration.api.test_events_stream import (
    DEADLINE_S,
    StreamingASGITransport,
    enqueue,
    frames_until,
    last_event_id,
    seen,
)
from tests.integration.web.test_dashboard import csrf_of, sign_in


@pytest.fixture
async def http(world: ApiWorld) -> AsyncIterator[httpx.AsyncClient]:
    """A streaming client on an app over the world's context."""
    context = ApiContext(
        db=world.cluster.db,
        agents=world.agents,
        sessions=world.cluster.controller,
        events=world.cluster.events,
    )
    transport = StreamingASGITransport(create_app(context))
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as client:
        yield client


async def test_the_page_stream_replays_after_since_carries_only_own_events_unnamed(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """From `since` (what the page was rendered after), Bob's page stream brings his new
    session's event and never Alice's; frames have no `event:` line (EventSource's onmessage)."""
    bob = await sign_in(world, world.bob)
    since = await last_event_id(world)
    alices = str(await enqueue(world, world.alice.user.user_id))
    bobs = str(await enqueue(world, world.bob.user.user_id))
    async with http.stream("GET", "/ui/stream", params={"since": since}, headers=bob) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        frames = await frames_until(answer.aiter_lines(), seen(bobs))
        during = await http.get("/ui/events", headers=bob)
        assert during.headers[DASHBOARDS_HEADER] == "1"  # what the page's script paces by
    after = await http.get("/ui/events", headers=bob)
    assert after.headers[DASHBOARDS_HEADER] == "0"
    assert "event" not in frames[0]
    shown = {json.loads(f["data"])["entity_id"] for f in frames}
    assert bobs in shown and alices not in shown
    # Slim: what a page needs to decide to refresh, not the event's payload.
    assert {tuple(sorted(json.loads(f["data"]))) for f in frames} == {("entity_id", "id", "kind")}


async def test_a_session_page_streams_its_session_and_a_list_page_one_frame_a_batch(
    world: ApiWorld, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live: a session's page (`?entity=`) is sent that session's events and no other's; a
    list page is sent one frame for the batch of three sessions' events, saying how many. The
    batch gathers until the test says so (not for a time)."""
    gathered = asyncio.Event()

    async def gather(_hub: DashboardHub) -> None:
        await gathered.wait()

    monkeypatch.setattr(DashboardHub, "_gather", gather)
    bob = await sign_in(world, world.bob)
    watched = str(await enqueue(world, world.bob.user.user_id))
    async with (
        http.stream("GET", "/ui/stream", params={"entity": watched}, headers=bob) as one,
        http.stream("GET", "/ui/stream", headers=bob) as many,
    ):
        one_lines, many_lines = one.aiter_lines(), many.aiter_lines()
        for lines in (one_lines, many_lines):  # subscribed: live events from here on
            assert await anext(lines) == ": connected"
        others = [str(await enqueue(world, world.bob.user.user_id)) for _ in range(2)]
        await world.cluster.controller.mark_terminate([SessionId(uuid.UUID(watched))], "test")
        gathered.set()
        one_frames = await frames_until(one_lines, seen(watched))
        many_frames = await frames_until(many_lines, lambda frames: bool(frames))
    assert {json.loads(f["data"])["entity_id"] for f in one_frames} == {watched}
    (summary,) = [json.loads(f["data"]) for f in many_frames]
    assert summary["events"] == 3  # two created, one ended
    assert summary["entity_id"] in {watched, *others}


async def test_a_page_stream_ends_once_its_dashboard_session_does(
    world: ApiWorld, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob signs out in another tab: his open page stream ends (at the next check, here made
    frequent), and the browser's reconnect is refused."""
    monkeypatch.setattr(api_events, "RECHECK_S", 0.05)
    bob = await sign_in(world, world.bob)
    async with http.stream("GET", "/ui/stream", headers=bob) as answer:
        lines = answer.aiter_lines()
        assert await anext(lines) == ": connected"
        csrf = csrf_of(bob)
        out = await http.post("/ui/sign-out", data={CSRF_FIELD: csrf}, headers=bob)
        assert out.status_code == 303, out.text
        async with asyncio.timeout(DEADLINE_S):
            async for _ in lines:  # until the stream ends by itself
                pass
    assert (await http.get("/ui/stream", headers=bob)).status_code == 401
