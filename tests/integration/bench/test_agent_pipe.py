"""The agent protocol over `corral simulate`'s socket pair: a real controller on SQLite and
PostgreSQL at one end, the agents' client at the other, answers as over HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import KernelReportMessage, RegisterRequest
from corral.bench.agent_pipe import AgentPipeServer, PipeManagerClient
from corral.controller.agents import AgentController, AgentTimings
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus, SessionStatus
from corral.store.database import Database
from tests.integration._polling import eventually
from tests.integration.coordination._harness import Cluster, make_cluster

JOIN = "join-secret"
K, S = KernelStatus, SessionStatus


@dataclass
class Pipe:
    """Both ends of the pipe, the cluster behind the manager's, and what each end was told."""

    cluster: Cluster
    server: AgentPipeServer
    client: PipeManagerClient
    events: list[dict[str, Any]] = field(default_factory=list)
    controls: list[str] = field(default_factory=list)

    async def join(self, agent_id: str) -> str:
        request = RegisterRequest(
            agent_id=agent_id, address="10.0.0.1", slots=ResourceSlots({"cpu": 4, "mem": "8g"})
        )
        response = await self.client.register(request, JOIN)
        assert response.agent_id == agent_id
        assert response.token is not None
        return response.token


@pytest.fixture
async def pipe(db: Database) -> AsyncIterator[Pipe]:
    cluster = await make_cluster(db, [])
    controller = AgentController(
        db,
        cluster.hints,
        join_token=JOIN,
        timings=AgentTimings(heartbeat_timeout_s=30, assignment_wait_s=30, poll_recheck_s=60),
        clock=cluster.clock,
    )
    watcher = asyncio.create_task(controller.polls.run())
    events: list[dict[str, Any]] = []
    controls: list[str] = []
    server = AgentPipeServer(controller, events.append)
    client = PipeManagerClient(controls.append)
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    await loop.create_unix_connection(lambda: server.connection, sock=ours)
    await loop.create_unix_connection(lambda: client.connection, sock=theirs)
    yield Pipe(cluster, server, client, events, controls)
    await server.close()
    client.connection.close()
    await asyncio.wait_for(client.connection.closed, 10)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)


async def test_an_agent_joins_polls_and_reports_through_the_controller(pipe: Pipe) -> None:
    """Register with the join token, heartbeat, read the assignment, report progress: each
    answered by the controller, the report landing in the store."""
    await pipe.join("node-1")
    assert (await pipe.client.heartbeat("node-1")).status == "ALIVE"
    sid = await pipe.cluster.submit()
    await pipe.cluster.coordinator.run_all()
    assignment = await pipe.client.assignment("node-1", None, 0)
    [kernel] = assignment.kernels
    assert (kernel.session_id, kernel.status) == (sid, K.PREPARING)
    await pipe.client.report("node-1", [KernelReportMessage(kernel_id=kernel.id, status=K.PULLING)])
    [stored] = (await pipe.cluster.session(sid)).kernels
    assert stored.status is K.PULLING
    later = await pipe.client.assignment("node-1", None, 0)
    assert later.revision >= assignment.revision


async def test_refusals_arrive_as_the_http_statuses(pipe: Pipe) -> None:
    """A wrong join token 401, an unknown agent 404, an impossible report refused alone in
    the answer (naming the kernel), a message that is not valid 422."""
    with pytest.raises(ManagerRejectedError) as wrong:
        await pipe.client.register(
            RegisterRequest(agent_id="node-2", address="h", slots=ResourceSlots({"cpu": 1})),
            "not-the-join-token",
        )
    assert wrong.value.status == 401
    with pytest.raises(ManagerRejectedError) as unknown:
        await pipe.client.heartbeat("nobody")
    assert unknown.value.status == 404

    await pipe.join("node-1")
    sid = await pipe.cluster.submit()
    await pipe.cluster.coordinator.run_all()
    [kernel] = (await pipe.client.assignment("node-1", None, 0)).kernels
    impossible = await pipe.client.report(
        "node-1",
        [
            KernelReportMessage(kernel_id=kernel.id, status=K.PULLING),
            KernelReportMessage(kernel_id=kernel.id, status=K.RUNNING),
        ],
    )
    assert (impossible.applied, set(impossible.refused)) == (1, {str(kernel.id)})
    assert (await pipe.cluster.session(sid)).kernels[0].status is K.PULLING

    # Built past the agent's own validation: an exit code no column can hold.
    bogus = KernelReportMessage.model_construct(
        kernel_id=kernel.id, status=K.PULLING, exit_code=2**40
    )
    with pytest.raises(ManagerRejectedError) as invalid:
        await pipe.client.report("node-1", [bogus])
    assert invalid.value.status == 422
    assert "exit_code" in str(invalid.value.problem["errors"])
    assert (await pipe.cluster.session(sid)).kernels[0].status is K.PULLING


async def test_events_and_controls_cross_the_pipe(pipe: Pipe) -> None:
    """The agents' end tells the manager's (`registered`, `done`), and the other way (`stop`)."""
    pipe.client.send_event("done", reports=7)
    pipe.server.send_control("stop")
    await eventually(lambda: bool(pipe.events and pipe.controls), "event and control arrive")
    assert pipe.events == [{"event": "done", "reports": 7}]
    assert pipe.controls == ["stop"]


async def test_a_closed_pipe_fails_calls_as_an_unreachable_manager(pipe: Pipe) -> None:
    """A long poll in wait when the manager's end closes, and every call after: the agent's
    retryable error (it backs off), not a hang."""
    await pipe.join("node-1")
    current = await pipe.client.assignment("node-1", None, 0)
    waiting = asyncio.create_task(pipe.client.assignment("node-1", current.revision, 30))
    await eventually(lambda: pipe.server.answering == 1, "the long poll is in wait")
    await pipe.server.close()
    with pytest.raises(ManagerUnavailableError):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(ManagerUnavailableError, match="closed"):
        await pipe.client.heartbeat("node-1")
