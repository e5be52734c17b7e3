"""The agent protocol over one Unix socket: the same answers and errors as the HTTP routes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import KernelReportMessage, RegisterRequest
from corral.controller.agents import AgentController
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus
from corral.infra.hints import open_hint_bus
from corral.manager.stream import (
    MAX_FRAME,
    AgentChannel,
    StreamClosedError,
    StreamManagerClient,
    read_frame,
    serve_agents,
    write_frame,
)
from corral.store.database import Database

JOIN = "join-secret"


@dataclass
class Link:
    """A manager serving one socket, and an agents' channel connected to it."""

    channel: AgentChannel
    client: StreamManagerClient
    to_manager: list[tuple[str, Any]] = field(default_factory=list)
    to_agents: list[tuple[str, Any]] = field(default_factory=list)
    manager_ends: list[asyncio.StreamWriter] = field(default_factory=list)


@pytest.fixture
async def link(db: Database, tmp_path: Path) -> AsyncIterator[Link]:
    hints = await open_hint_bus("memory")
    controller = AgentController(db, hints, join_token=JOIN)
    polls = asyncio.create_task(controller.polls.run())
    to_manager: list[tuple[str, Any]] = []
    ends: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ends.append(writer)
        await serve_agents(controller, reader, writer, lambda k, b: to_manager.append((k, b)))
        writer.close()

    server = await asyncio.start_unix_server(serve, path=str(tmp_path / "m.sock"))
    to_agents: list[tuple[str, Any]] = []
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / "m.sock"))
    channel = AgentChannel(reader, writer, lambda k, b: to_agents.append((k, b)))
    yield Link(channel, StreamManagerClient(channel), to_manager, to_agents, ends)
    await channel.close()
    server.close()
    polls.cancel()
    await asyncio.gather(polls, return_exceptions=True)
    await hints.close()


def _request(agent_id: str = "node-1") -> RegisterRequest:
    return RegisterRequest(
        agent_id=agent_id, address="10.0.0.1", slots=ResourceSlots({"cpu": 4, "mem": "8g"})
    )


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_an_agent_registers_heartbeats_and_reads_its_assignment(link: Link) -> None:
    """Register with the join token (a token of its own comes back), then speak with it."""
    registered = await link.client.register(_request(), JOIN)
    assert registered.agent_id == "node-1"
    assert registered.token  # shown once, on joining
    assert (await link.client.heartbeat("node-1")).status == "ALIVE"
    assignment = await link.client.assignment("node-1", None, 0.0)
    assert assignment.agent_id == "node-1"
    assert assignment.kernels == []


async def test_refusals_come_back_with_their_http_status_and_problem(link: Link) -> None:
    """A wrong token is 401, an unknown agent 404, an impossible report 409 naming the kernel,
    an unknown call 422: each raises what the HTTP client would."""
    with pytest.raises(ManagerRejectedError) as wrong_token:
        await link.client.register(_request(), "not-the-token")
    assert wrong_token.value.status == 401
    with pytest.raises(ManagerRejectedError) as unknown:
        await link.client.heartbeat("nobody")
    assert unknown.value.status == 404
    await link.client.register(_request(), JOIN)
    stranger = uuid.uuid4()
    with pytest.raises(ManagerRejectedError) as refused:
        await link.client.report(
            "node-1", [KernelReportMessage(kernel_id=stranger, status=KernelStatus.PULLING)]
        )
    assert refused.value.status == 409
    assert refused.value.conflicts == {str(stranger): "no such kernel"}
    with pytest.raises(ManagerRejectedError) as malformed:
        await link.channel.call("launch-missiles", "node-1", None)
    assert malformed.value.status == 422
    assert "launch-missiles" in str(malformed.value)


async def test_control_messages_reach_the_other_end(link: Link) -> None:
    """`ready` goes up to the manager; `stop` comes down to the agents."""
    link.channel.control("ready", {"agents": 3})
    await _until(lambda: link.to_manager)
    assert link.to_manager == [("ready", {"agents": 3})]
    write_frame(link.manager_ends[0], [0, "stop", None])
    await _until(lambda: link.to_agents)
    assert link.to_agents == [("stop", None)]


async def test_calls_fail_as_unavailable_once_the_manager_is_gone(link: Link) -> None:
    """A waiting call, and every later one, raises ManagerUnavailableError (agents back off)."""
    await link.client.register(_request(), JOIN)
    revision = (await link.client.assignment("node-1", None, 0.0)).revision
    waiting = asyncio.create_task(link.client.assignment("node-1", revision, 30.0))
    await asyncio.sleep(0)  # the long poll is on its way
    link.manager_ends[0].close()
    with pytest.raises(ManagerUnavailableError):
        await asyncio.wait_for(waiting, 5.0)
    await _until(link.channel.closed.is_set)
    with pytest.raises(ManagerUnavailableError):
        await link.client.heartbeat("node-1")


async def test_a_frame_that_is_not_a_call_or_a_cut_frame_is_an_error() -> None:
    """Garbage, or a stream cut inside a frame, raise StreamClosedError; a clean end is None."""
    for data, expected in (
        ((5).to_bytes(4, "big") + b"12345", "not an [id, ...] array"),
        ((9).to_bytes(4, "big") + b"[1,", "inside a frame"),
        ((MAX_FRAME + 1).to_bytes(4, "big"), "at most"),
    ):
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        with pytest.raises(StreamClosedError, match=expected.replace("[", "\\[")):
            await read_frame(reader)
    reader = asyncio.StreamReader()
    reader.feed_data((7).to_bytes(4, "big") + b'[0,"x"]')
    reader.feed_eof()
    assert await read_frame(reader) == [0, "x"]
    assert await read_frame(reader) is None
