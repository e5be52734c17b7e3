"""The agent's HTTP to its managers against real sockets: kept-alive connections of its own,
answers and failures as the agent reads them, and httpx where the environment names a proxy."""

from __future__ import annotations

import json

import pytest

from corral.agent.client import HttpManagerClient, ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import KernelReportMessage
from corral.domain.status import KernelStatus
from corral.infra.keepalive_http import KeepAliveClient
from tests.integration.bench.test_keepalive_client import server

AGENT = "node-a"
TOKEN = "agt_secret"


def answer(status: int, body: object, *, kind: str = "application/json") -> bytes:
    data = json.dumps(body).encode() if kind == "application/json" else str(body).encode()
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 503: "Service Unavailable"}
    return (
        f"HTTP/1.1 {status} {reason[status]}\r\ncontent-type: {kind}\r\n"
        f"content-length: {len(data)}\r\n\r\n"
    ).encode() + data


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy from the test's environment, unless a test sets one."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def client(url: str | list[str]) -> HttpManagerClient:
    agent = HttpManagerClient(url, timeout_s=5.0)
    agent._token = TOKEN  # as registering leaves it
    return agent


def by_path(head: bytes) -> bytes:
    """A manager's answers to the calls the agent makes, by the request's path."""
    line = head.split(b"\r\n", 1)[0].decode()
    if "/heartbeat" in line:
        return answer(200, {"status": "ALIVE"})
    if "/reports" in line:
        return answer(200, {"applied": 1})
    if "/assignments" in line:
        return answer(200, {"agent_id": AGENT, "revision": 7, "kernels": []})
    return answer(404, {"title": "Not found", "status": 404, "detail": f"no route: {line}"})


async def test_calls_share_a_kept_alive_connection_with_the_token_body_and_query() -> None:
    """A heartbeat, a report and a poll go on one connection, each with the agent's token;
    the report's JSON body and the poll's query are as the manager reads them."""
    async with server(by_path) as (url, heads, connections):
        agent = client(url)
        try:
            assert (await agent.heartbeat(AGENT)).status == "ALIVE"
            report = KernelReportMessage(
                kernel_id="7f9c1b64-5a8e-4e8c-9c0c-3c3f0d2a8e11",
                status=KernelStatus.RUNNING,
                attempt=1,
            )
            await agent.report(AGENT, [report])
            assignment = await agent.assignment(AGENT, since=6, wait_s=2.5)
        finally:
            await agent.close()
    assert assignment.revision == 7
    assert len(connections) == 1
    heartbeat, sent_report, poll = (h.decode() for h in heads)
    assert heartbeat.startswith(f"POST /v1/agents/{AGENT}/heartbeat HTTP/1.1\r\n")
    for head in (heartbeat, sent_report, poll):
        assert f"Authorization: Bearer {TOKEN}\r\n" in head
    body = json.loads(sent_report.split("\r\n\r\n", 1)[1])
    assert body["reports"][0]["status"] == "RUNNING"
    assert "Content-Type: application/json\r\n" in sent_report
    assert poll.startswith(f"GET /v1/agents/{AGENT}/assignments?wait=2.5&since=6 HTTP/1.1\r\n")


async def test_a_refusal_is_the_managers_problem_and_a_5xx_fails_over() -> None:
    """A 4xx raises ManagerRejectedError with the problem (or the text of a page that is not
    one); a 5xx from every manager is ManagerUnavailableError naming each."""

    def refuse(head: bytes) -> bytes:
        if b"/heartbeat" in head:
            return answer(401, {"title": "Not this agent's token", "status": 401})
        return answer(404, "<html>no such page</html>", kind="text/html")

    async with server(refuse) as (url, _heads, _connections):
        agent = client(url)
        try:
            with pytest.raises(ManagerRejectedError) as rejected:
                await agent.heartbeat(AGENT)
            assert (rejected.value.status, rejected.value.problem["title"]) == (
                401,
                "Not this agent's token",
            )
            with pytest.raises(ManagerRejectedError) as page:
                await agent.assignment(AGENT, since=None, wait_s=0)
            assert page.value.problem == {"detail": "<html>no such page</html>"}
        finally:
            await agent.close()

    unavailable = lambda _head: answer(503, {"title": "Stopping", "status": 503})  # noqa: E731
    async with server(unavailable) as (first, _h1, _c1), server(unavailable) as (second, _h2, _c2):
        agent = client([first, second])
        try:
            with pytest.raises(ManagerUnavailableError) as failed:
                await agent.heartbeat(AGENT)
        finally:
            await agent.close()
    assert f"{first}: HTTP 503" in str(failed.value)
    assert f"{second}: HTTP 503" in str(failed.value)


async def test_a_connection_idle_past_the_keepalive_is_not_reused() -> None:
    """Within `keepalive_s` of its last answer a connection carries the next request; past
    it, a new one does (the manager may be closing the old one just then)."""
    now = [0.0]
    async with server(by_path) as (url, _heads, connections):
        lean = KeepAliveClient(url, timeout_s=5, keepalive_s=12.0, clock=lambda: now[0])
        try:
            await lean.request("POST", f"/v1/agents/{AGENT}/heartbeat")
            now[0] = 11.0
            await lean.request("POST", f"/v1/agents/{AGENT}/heartbeat")
            assert len(connections) == 1
            now[0] = 23.5
            await lean.request("POST", f"/v1/agents/{AGENT}/heartbeat")
            assert len(connections) == 2
        finally:
            await lean.close()


async def test_with_a_proxy_configured_calls_go_through_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY set: the agent's calls go to the proxy, naming the manager (a host only the
    proxy could reach), over httpx."""
    async with server(by_path) as (proxy, heads, _connections):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        agent = client("http://manager.invalid:8470")
        try:
            assert (await agent.heartbeat(AGENT)).status == "ALIVE"
        finally:
            await agent.close()
    [head] = heads
    assert head.decode().startswith(
        f"POST http://manager.invalid:8470/v1/agents/{AGENT}/heartbeat HTTP/1.1\r\n"
    )
    assert f"Bearer {TOKEN}\r\n" in head.decode()
