"""The serving proxy as users reach it, with the real manager, a local agent and real HTTP
servers as replicas (`corral up` in this process): access by token or open, `Host:` name
routing, the proxy's metrics, and a route table change reaching the proxy within moments."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.domain.slots import ResourceSlots
from corral.manager.up import UpConfig, UpReady, run_up

SERVER = """
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = json.dumps({
            "port": int(os.environ["CORRAL_PORT"]),
            "path": self.path,
            "authorization": self.headers.get("Authorization"),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(os.environ["CORRAL_PORT"])), Handler).serve_forever()
"""

DOMAIN = "corral.test"
DEADLINE_S = 60.0
ROTATIONS = 20  # token rotations timed on their way to the proxy
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
async def up(tmp_path: Path) -> AsyncIterator[UpReady]:
    """`corral up` (manager, one local agent, the proxy with a domain) in this process."""
    config = UpConfig(
        data_dir=tmp_path / "data",
        slots=ResourceSlots.parse("cpu=4 mem=4g"),
        port=0,
        proxy_port=0,
        proxy_domain=DOMAIN,
    )
    stop = asyncio.Event()
    ready: asyncio.Future[UpReady] = asyncio.get_running_loop().create_future()
    running = asyncio.create_task(run_up(config, ready.set_result, stop))
    await asyncio.wait({running, ready}, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        running.result()  # raises what stopped it
    try:
        yield ready.result()
    finally:
        stop.set()
        await running


async def _until(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll `check` until it returns something true; its value."""
    end = time.monotonic() + DEADLINE_S
    last: Any = None
    while time.monotonic() < end:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not within {DEADLINE_S} s; last seen {last!r}")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_access_by_token_or_open_host_names_metrics_and_prompt_table_changes(
    up: UpReady, tmp_path: Path
) -> None:
    """A deployment by token answers 401 without its token, or with a user's API token (its
    owner's or another user's), 200 with it, which the replica never sees; an open one
    answers anyone; `Host: <name>.<domain>` reaches a deployment whole; the proxy's /metrics
    counts the answers; a rotated token replaces the old one at the proxy within moments."""
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    assert up.proxy_url is not None
    admin = _bearer(up.admin_token)
    async with (
        httpx.AsyncClient(base_url=up.url, headers=admin, timeout=30) as api,
        httpx.AsyncClient(base_url=up.proxy_url, timeout=30) as proxy,
    ):
        assert (await api.post("/v1/users", json={"name": "bob"})).status_code == 201
        issued = await api.post("/v1/users/bob/tokens", json={"name": "test"})
        bob = _bearer(issued.json()["token"])

        spec = {
            "image": "python",
            "command": ["python", str(server)],
            "resources": {"cpu": "0.25", "mem": "64m"},
            "health_check": {"interval_s": 0.5},
        }
        closed = await api.post("/v1/deployments", json={**spec, "name": "closed"})
        assert closed.status_code == 201, closed.text
        assert closed.json()["access"] == "token"
        token = closed.json()["token"]
        assert token.startswith("crld_")
        opened = await api.post(
            "/v1/deployments", json={**spec, "name": "public", "access": "open"}
        )
        assert opened.json()["access"] == "open" and opened.json()["token"] is None
        # The token is shown once: reading the deployment does not show it.
        assert "token" not in (await api.get("/v1/deployments/closed")).json()

        async def served(name: str, headers: dict[str, str] | None = None) -> httpx.Response:
            return await proxy.get(f"/{name}/hello?x=1", headers=headers)

        async def answered(name: str, headers: dict[str, str] | None = None) -> Any:
            answer = await served(name, headers)
            return answer.status_code == 200 and answer.json()

        seen = await _until("the open deployment served", lambda: answered("public"))
        assert seen["path"] == "/hello?x=1"
        seen = await _until("the closed one served", lambda: answered("closed", _bearer(token)))
        assert seen["authorization"] is None  # the deployment's token stays at the proxy

        refused = await served("closed")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["type"].endswith("/deployment-token-required")
        for other in (bob, admin, _bearer("crld_guessed")):
            assert (await served("closed", other)).status_code == 401
        # An open deployment's replica sees the caller's own Authorization (its own API key).
        seen = (await served("public", bob)).json()
        assert seen["authorization"] == bob["Authorization"]

        # By host name: the whole path goes to the deployment, the same rules apply.
        by_host = await proxy.get("/v1/models", headers={"Host": f"public.{DOMAIN}"})
        assert by_host.status_code == 200 and by_host.json()["path"] == "/v1/models"
        host = {"Host": f"closed.{DOMAIN}:8080"}
        assert (await proxy.get("/", headers=host)).status_code == 401
        assert (await proxy.get("/", headers=host | _bearer(token))).status_code == 200

        # A rotated token: the old one is refused and the new one let through, within moments.
        rotated = await api.post("/v1/deployments/closed/token")
        assert rotated.status_code == 200, rotated.text
        fresh = rotated.json()["token"]
        started = time.monotonic()
        await _until(
            "the rotated token at the proxy",
            lambda: answered("closed", _bearer(fresh)),
        )
        took_s = time.monotonic() - started
        assert (await served("closed", _bearer(token))).status_code == 401
        print(f"rotated token reached the proxy in {took_s * 1000:.0f} ms")
        routes = await api.get("/v1/serving/routes")
        entry = next(d for d in routes.json()["deployments"] if d["name"] == "closed")
        assert entry["token_hash"] == hashlib.sha256(fresh.encode()).hexdigest()

        refusal = await api.post("/v1/deployments/public/token")
        assert refusal.status_code == 409
        assert refusal.json()["type"].endswith("/deployment-not-by-token")
        assert (await api.post("/v1/deployments/closed/token", headers=bob)).status_code == 404

        # Measured, not asserted (the deadline is): a route coming up after its session runs
        # (woken by the session's start), and rotations reaching the proxy (pushed).
        route = (await api.get("/v1/deployments/closed")).json()["routes"][0]
        session_ran = await _event_at(api, str(route["session_id"]), "to", "RUNNING")
        route_up = await _event_at(api, str(route["id"]), "to", "degraded")
        print(f"route DEGRADED {(route_up - session_ran) * 1000:.0f} ms after its session ran")
        took = []
        for _ in range(ROTATIONS):
            fresh = (await api.post("/v1/deployments/closed/token")).json()["token"]
            started = time.monotonic()
            opens = _bearer(fresh)
            await _until("a rotation at the proxy", lambda h=opens: answered("closed", h))
            took.append(time.monotonic() - started)
        took.sort()
        print(
            f"{ROTATIONS} rotations reached the proxy: p50 {took[len(took) // 2] * 1000:.0f} ms, "
            f"max {took[-1] * 1000:.0f} ms"
        )

        metrics = (await proxy.get("/metrics")).text
        closed_id = closed.json()["id"]
        refusals = _sample(metrics, "corral_proxy_requests_total", closed_id, "401")
        assert refusals >= 6
        assert _sample(metrics, "corral_proxy_requests_total", closed_id, "200") >= 3
        assert f'corral_proxy_response_start_seconds_count{{deployment="{closed_id}"}}' in metrics


async def _event_at(api: httpx.AsyncClient, entity_id: str, field: str, value: str) -> float:
    """When (a POSIX timestamp) the entity's first event with `payload[field] == value` was
    recorded."""
    page = await api.get("/v1/events", params={"follow": "false", "entity_id": entity_id})
    found = [e["created_at"] for e in page.json()["items"] if e["payload"].get(field) == value]
    assert found, page.json()
    return datetime.fromisoformat(found[0]).timestamp()


def _sample(metrics: str, name: str, deployment: str, code: str) -> float:
    pattern = rf'^{name}\{{code="{code}",deployment="{deployment}"\}} (\S+)$'
    found = re.search(pattern, metrics, re.MULTILINE)
    if found is None:
        pattern = rf'^{name}\{{deployment="{deployment}",code="{code}"\}} (\S+)$'
        found = re.search(pattern, metrics, re.MULTILINE)
    assert found is not None, f"no {name} for {deployment} {code} in:\n{metrics}"
    return float(found.group(1))
