"""The SDK on the real API app (in-process, streaming), over the API tests' world."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from corral.api.app import ApiContext, create_app
from corral.client import Client
from tests.integration.api.conftest import ApiWorld, Caller, world
from tests.integration.api.test_events_stream import StreamingASGITransport

__all__ = ["world"]  # the API tests' fixture, shared

Connect = Callable[[Caller], Client]


@pytest.fixture
def api_context(world: ApiWorld) -> ApiContext:
    """What the app of `connect` works with (a test sets its `closing`, as a stopping manager
    does)."""
    return ApiContext(
        db=world.cluster.db,
        agents=world.agents,
        sessions=world.cluster.controller,
        events=world.cluster.events,
    )


@pytest.fixture
async def connect(api_context: ApiContext) -> AsyncIterator[Connect]:
    """Makes an SDK client for a caller, on an app over the world's controllers and buses."""
    transport = StreamingASGITransport(create_app(api_context))
    clients: list[Client] = []

    def make(caller: Caller) -> Client:
        token = caller.headers["Authorization"].removeprefix("Bearer ")
        clients.append(Client("http://manager", token, transport=transport))
        return clients[-1]

    yield make
    for client in clients:
        await client.aclose()
