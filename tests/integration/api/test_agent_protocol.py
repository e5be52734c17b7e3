"""The agent protocol over HTTP (the real app, in-process transport), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from corral.api.app import ApiContext, create_app
from corral.controller.agents import AgentController, AgentTimings
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.kernel_logs import read_outputs
from corral.store.log_reading import read_log
from corral.store.tables import session_history, sessions
from tests.integration.coordination._harness import Cluster, make_cluster

JOIN = "join-secret"
K, S = KernelStatus, SessionStatus


@dataclass
class Api:
    """An HTTP client on the app, the cluster behind it, and the controller."""

    http: httpx.AsyncClient
    cluster: Cluster
    agents: AgentController

    async def register(self, agent_id: str, token: str = JOIN, **body: Any) -> httpx.Response:
        payload = {"agent_id": agent_id, "address": "10.0.0.1", "slots": {"cpu": 4, "mem": "8g"}}
        return await self.http.post(
            "/v1/agents/register", json={**payload, **body}, headers=bearer(token)
        )

    async def join(self, agent_id: str) -> str:
        """Register a new agent; its token."""
        response = await self.register(agent_id)
        assert response.status_code == 201, response.text
        token = response.json()["token"]
        assert isinstance(token, str)
        return token

    async def running_kernel(self, agent_id: str, token: str) -> tuple[SessionId, KernelId]:
        """A session submitted and driven until its kernel is asked to PREPARE on the agent."""
        sid = await self.cluster.submit()
        await self.cluster.coordinator.run_all()
        session = await self.cluster.session(sid)
        assert session.status is S.PREPARING, session.status
        kernel = session.kernels[0]
        assert kernel.agent_id == agent_id
        return sid, kernel.id


async def run_until(api: Api, sid: SessionId, status: SessionStatus, runs: int = 4) -> None:
    """Run the coordinator's tasks until the session is in `status` (at most `runs` rounds)."""
    for _ in range(runs):
        await api.cluster.coordinator.run_all()
        if (await api.cluster.session(sid)).status is status:
            return
    raise AssertionError(f"session {sid} not {status} after {runs} rounds")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(db: Database) -> AsyncIterator[Api]:
    cluster = await make_cluster(db, [])
    agents = AgentController(
        db,
        cluster.hints,
        join_token=JOIN,
        timings=AgentTimings(heartbeat_timeout_s=30, assignment_wait_s=30, poll_recheck_s=60),
        clock=cluster.clock,
    )
    watcher = asyncio.create_task(agents.polls.run())
    context = ApiContext(db=db, agents=agents, sessions=cluster.controller)
    transport = httpx.ASGITransport(app=create_app(context))
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
        yield Api(http, cluster, agents)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)


async def test_register_issues_a_token_once_and_a_restart_keeps_the_id(api: Api) -> None:
    """Join token → 201 and a token; the agent's own token → 200, same id, no new token."""
    token = await api.join("node-1")
    again = await api.register("node-1", token=token, slots={"cpu": 8, "mem": "8g"})
    assert again.status_code == 200, again.text
    assert again.json()["agent_id"] == "node-1"
    assert again.json()["token"] is None
    ledger = await read_ledger(api.cluster.db)
    assert ledger[AgentId("node-1")]["cpu"] == [8000, 0]


async def test_registration_refusals_are_problem_details(api: Api) -> None:
    """Bad token 401, a live id taken 409, bad slots 422: each a problem naming the issue."""
    await api.join("node-1")
    latin = await api.http.post(  # a header byte outside ASCII: still just a 401
        "/v1/agents/register",
        json={"agent_id": "node-2", "address": "h", "slots": {"cpu": 1}},
        headers={"Authorization": b"Bearer t\xf6ken"},
    )
    assert latin.status_code == 401
    wrong = await api.register("node-2", token="not-the-join-token")
    assert wrong.status_code == 401
    assert wrong.headers["content-type"] == "application/problem+json"
    assert wrong.json()["type"].endswith("/unauthenticated")
    taken = await api.register("node-1")
    assert taken.status_code == 409
    assert taken.json()["type"].endswith("/agent-id-taken")
    bad = await api.register("node-3", slots={"cpu": "-1"})
    assert bad.status_code == 422
    assert bad.json()["errors"] == [
        {"field": "slots.cpu", "message": "must not be negative (got -1)"}
    ]
    assert bad.json()["detail"] == "slots.cpu: must not be negative (got -1)"
    anonymous = await api.http.post("/v1/agents/register", json={})
    assert anonymous.status_code == 401


async def test_calls_need_the_agents_own_token(api: Api) -> None:
    """Another agent's token opens nothing; an unknown agent is a 404."""
    token_1 = await api.join("node-1")
    token_2 = await api.join("node-2")
    ok = await api.http.post("/v1/agents/node-1/heartbeat", headers=bearer(token_1))
    assert ok.json() == {"status": "ALIVE"}
    crossed = await api.http.post("/v1/agents/node-1/heartbeat", headers=bearer(token_2))
    assert crossed.status_code == 401
    join_only = await api.http.get("/v1/agents/node-1/assignments", headers=bearer(JOIN))
    assert join_only.status_code == 401
    unknown = await api.http.post("/v1/agents/nobody/heartbeat", headers=bearer(token_1))
    assert unknown.status_code == 404


async def test_long_poll_answers_when_the_assignment_changes(api: Api) -> None:
    """A poll at the current revision waits; a handler asking the agent to act answers it."""
    token = await api.join("node-1")
    first = await api.http.get(
        "/v1/agents/node-1/assignments", params={"wait": 0}, headers=bearer(token)
    )
    revision = first.json()["revision"]
    assert first.json()["kernels"] == []
    poll = asyncio.create_task(
        api.http.get(
            "/v1/agents/node-1/assignments",
            params={"since": revision, "wait": 30},
            headers=bearer(token),
        )
    )
    while not api.agents.polls.waiting(AgentId("node-1")):  # until the poll is parked
        assert not poll.done(), poll.result().text
        await asyncio.sleep(0.01)
    _, kernel_id = await api.running_kernel("node-1", token)
    answer = (await asyncio.wait_for(poll, 20)).json()
    assert answer["revision"] > revision
    (kernel,) = answer["kernels"]
    assert (kernel["id"], kernel["desired_state"]) == (str(kernel_id), "PREPARE")
    assert kernel["cluster_hosts"] == ["10.0.0.1"]


async def test_reports_apply_as_far_as_legal_and_a_resent_batch_is_acknowledged(
    api: Api,
) -> None:
    """An impossible report is refused alone (named per kernel; the rest applied); a batch
    re-sent after its answer was lost, with newer reports, is acknowledged and applied."""
    token = await api.join("node-1")
    sid, kid = await api.running_kernel("node-1", token)
    url = "/v1/agents/node-1/reports"
    bad = {
        "reports": [
            {"kernel_id": str(kid), "status": "PULLING"},
            {"kernel_id": str(kid), "status": "RUNNING"},
        ]
    }
    refused = await api.http.post(url, json=bad, headers=bearer(token))
    assert refused.status_code == 200
    assert refused.json() == {
        "applied": 1,
        "already": 0,
        "refused": {str(kid): "cannot move from PULLING to RUNNING"},
    }
    assert (await api.cluster.session(sid)).kernels[0].status is K.PULLING
    good = {
        "reports": [
            {"kernel_id": str(kid), "status": "PULLING"},
            {"kernel_id": str(kid), "status": "PREPARED"},
        ]
    }
    answer = await api.http.post(url, json=good, headers=bearer(token))
    assert answer.json() == {"applied": 1, "already": 1, "refused": {}}
    resent = {"reports": [*good["reports"], {"kernel_id": str(kid), "status": "CREATING"}]}
    again = await api.http.post(url, json=resent, headers=bearer(token))
    assert again.json() == {"applied": 1, "already": 2, "refused": {}}
    assert (await api.cluster.session(sid)).kernels[0].status is K.CREATING


async def test_logs_and_outputs_are_kept_once_and_only_from_the_kernels_agent(api: Api) -> None:
    """Chunks re-sent are stored once; another agent cannot upload for this kernel."""
    token = await api.join("node-1")
    other = await api.join("node-2")
    _, kid = await api.running_kernel("node-1", token)

    def chunk(offset: int, data: bytes) -> dict[str, Any]:
        return {
            "kernel_id": str(kid),
            "stream": "stdout",
            "offset": offset,
            "data": base64.b64encode(data).decode(),
        }

    body = {"chunks": [chunk(0, b"hello "), chunk(6, b"world\n")]}
    for _ in range(2):
        sent = await api.http.post("/v1/agents/node-1/logs", json=body, headers=bearer(token))
        assert sent.status_code == 204
    assert await read_log(api.cluster.db, kid, "stdout") == b"hello world\n"
    assert await read_log(api.cluster.db, kid, "stdout", offset=6) == b"world\n"
    stolen = await api.http.post("/v1/agents/node-2/logs", json=body, headers=bearer(other))
    assert stolen.status_code == 409
    output = {"outputs": [{"kernel_id": str(kid), "name": "model.txt", "data": "YWJj"}]}
    sent = await api.http.post("/v1/agents/node-1/outputs", json=output, headers=bearer(token))
    assert sent.status_code == 204
    assert await read_outputs(api.cluster.db, kid) == {"model.txt": b"abc"}
    not_base64 = {"chunks": [{**chunk(12, b"x"), "data": "***"}]}
    rejected = await api.http.post("/v1/agents/node-1/logs", json=not_base64, headers=bearer(token))
    assert rejected.status_code == 422


async def test_an_agent_lost_while_preparing_sends_the_session_elsewhere(api: Api) -> None:
    """Past the heartbeat timeout: LOST; its kernel had not started, so the session is not
    failed but goes back to PENDING (slots back, the agent in failed_agents) and is placed
    on another agent; the lost one can rejoin."""
    token = await api.join("node-1")
    sid, kid = await api.running_kernel("node-1", token)
    assert (await api.cluster.session(sid)).status is S.PREPARING
    api.cluster.clock.advance(29)
    assert (await api.agents.sweep_lost()).agent_ids == []
    other = await api.join("node-2")
    api.cluster.clock.advance(2)
    await api.http.post("/v1/agents/node-2/heartbeat", headers=bearer(other))
    lost = await api.agents.sweep_lost()
    assert lost.agent_ids == ["node-1"]
    assert (lost.kernels, lost.unstarted) == ({}, {sid})
    beat = await api.http.post("/v1/agents/node-1/heartbeat", headers=bearer(token))
    assert beat.json() == {"status": "LOST"}
    await api.cluster.coordinator.run_all()  # PrepareSessions gives up: back to PENDING
    assert (await api.cluster.session(sid)).status is S.PENDING
    await api.cluster.coordinator.run_all()  # placed again, on the agent that is left
    session = await api.cluster.session(sid)
    assert session.status is S.PREPARING, session
    (kernel,) = session.kernels
    assert (kernel.id, kernel.agent_id, kernel.status) == (kid, "node-2", K.PREPARING)
    async with api.cluster.db.read() as conn:
        failed = await conn.scalar(sa.select(sessions.c.failed_agents).where(sessions.c.id == sid))
        moves = [
            r.to_status
            for r in await conn.execute(
                sa.select(session_history.c.to_status)
                .where(session_history.c.session_id == sid)
                .order_by(session_history.c.id)
            )
        ]
    assert "node-1" in failed
    assert S.PENDING.value in moves and S.ERROR.value not in moves
    ledger = await read_ledger(api.cluster.db)
    assert (ledger[AgentId("node-1")]["cpu"][1], ledger[AgentId("node-2")]["cpu"][1]) == (
        0,
        kernel.occupied_slots["cpu"],
    )
    back = await api.register("node-1", token=token)
    assert back.status_code == 200
    beat = await api.http.post("/v1/agents/node-1/heartbeat", headers=bearer(token))
    assert beat.json() == {"status": "ALIVE"}


async def test_an_agent_lost_while_running_fails_its_kernel_with_agent_lost(api: Api) -> None:
    """A kernel that had started on the lost agent ends ERROR agent_lost, and so does its
    session; its slots are released with it."""
    token = await api.join("node-1")
    sid, kid = await api.running_kernel("node-1", token)
    url = "/v1/agents/node-1/reports"
    prepared = {"reports": [{"kernel_id": str(kid), "status": "PREPARED"}]}
    assert (await api.http.post(url, json=prepared, headers=bearer(token))).status_code == 200
    await run_until(api, sid, S.CREATING)
    running = {"reports": [{"kernel_id": str(kid), "status": "RUNNING"}]}
    assert (await api.http.post(url, json=running, headers=bearer(token))).status_code == 200
    await run_until(api, sid, S.RUNNING)
    api.cluster.clock.advance(31)
    lost = await api.agents.sweep_lost()
    assert (lost.kernels, lost.unstarted) == ({kid: K.RUNNING}, set())
    kernel = (await api.cluster.session(sid)).kernels[0]
    assert (kernel.status, kernel.failure_cause) == (K.ERROR, "agent_lost")
    assert (await read_ledger(api.cluster.db))[AgentId("node-1")]["cpu"][1] == 0
    await run_until(api, sid, S.ERROR)
    async with api.cluster.db.read() as conn:
        cause = await conn.scalar(sa.select(sessions.c.failure_cause).where(sessions.c.id == sid))
    assert cause == "agent_lost"


async def test_an_unknown_path_is_a_problem_too(api: Api) -> None:
    """404s of the router are problem details as well."""
    response = await api.http.get(f"/v1/agents/x/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_a_stopping_manager_answers_parked_polls_at_once(api: Api) -> None:
    """close(): a parked long-poll gets 503 manager-stopping now, and so does a new one."""
    token = await api.join("node-1")
    first = await api.http.get(
        "/v1/agents/node-1/assignments", params={"wait": 0}, headers=bearer(token)
    )
    poll = asyncio.create_task(
        api.http.get(
            "/v1/agents/node-1/assignments",
            params={"since": first.json()["revision"], "wait": 60},
            headers=bearer(token),
        )
    )
    while not api.agents.polls.waiting(AgentId("node-1")):
        assert not poll.done(), poll.result().text
        await asyncio.sleep(0.01)
    api.agents.polls.close()
    parked = await asyncio.wait_for(poll, 10)
    assert parked.status_code == 503
    assert parked.json()["type"].endswith("/manager-stopping")
    later = await api.http.get("/v1/agents/node-1/assignments", headers=bearer(token))
    assert later.status_code == 503
