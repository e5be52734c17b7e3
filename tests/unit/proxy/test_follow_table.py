"""The proxy keeps its route table current over one client and one event stream: a change event
re-reads the table, the poll re-reads it beside the stream, and only a stream that ends (or an
error) opens a new client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

from corral.client import Client
from corral.proxy.server import follow_table
from corral.proxy.table import RouteTable
from tests.unit.proxy._fake_client import FakeClientContext

NEVER_S = 3600.0


class _Manager(FakeClientContext):
    """The manager as the proxy's client sees it: its table's revision, its change events."""

    def __init__(self) -> None:
        self.revision = 1
        self.reads = 0  # route table reads
        self.clients = 0  # clients the proxy opened
        self.streams = 0  # event streams it followed
        self.events: asyncio.Queue[object | None] = asyncio.Queue()  # None ends the stream

    def client(self) -> Client:
        self.clients += 1
        return cast(Client, self)

    async def route_table(self) -> SimpleNamespace:
        self.reads += 1
        return SimpleNamespace(revision=self.revision, deployments=[])

    async def follow_events(self, since: int, entity_id: str) -> AsyncIterator[object]:
        self.streams += 1
        while (event := await self.events.get()) is not None:
            yield event


async def _eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition still false"
        await asyncio.sleep(0.001)


async def _following(manager: _Manager, table: RouteTable, poll_s: float) -> asyncio.Task[Any]:
    follower = asyncio.create_task(follow_table(manager.client, table, poll_s=poll_s))
    await _eventually(lambda: manager.streams == 1)
    return follower


async def test_the_poll_reads_the_table_beside_the_stream_without_a_new_client() -> None:
    manager, table = _Manager(), RouteTable()
    follower = await _following(manager, table, poll_s=0.01)
    try:
        await _eventually(lambda: manager.reads >= 5)
        assert (manager.clients, manager.streams) == (1, 1)
    finally:
        follower.cancel()


async def test_a_change_event_reads_the_table_and_an_ended_stream_starts_over() -> None:
    manager, table = _Manager(), RouteTable()
    follower = await _following(manager, table, poll_s=NEVER_S)
    try:
        assert table.revision == 1
        manager.revision = 2
        await manager.events.put({"kind": "route_table.changed"})
        await _eventually(lambda: table.revision == 2)
        await manager.events.put(None)  # the manager ended the stream
        await _eventually(lambda: manager.streams == 2)
        assert manager.clients == 2
    finally:
        follower.cancel()
