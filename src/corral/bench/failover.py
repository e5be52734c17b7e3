"""`corral bench failover`: how soon a replica that fails its health checks is out of rotation.

`corral up` (manager, a local agent, the proxy) runs in this process; an open deployment of
`replicas` replicas, each a small HTTP server that answers every path with its port and fails
its health path once a marker file for its port exists. Each round waits until the proxy
spreads requests over every replica, marks one sick (its requests still succeed: it is
unhealthy, not dead), and sends requests through the proxy one after another until the sick
replica has not answered `MISSES_TO_CALL` in a row: it is out of rotation from the first of
those. The figure is compared with issue 38's bound, `failure_threshold x interval_s + 1 s`.
The replacement the deployment starts is waited for before the next round.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from corral.bench.latency import percentile
from corral.domain.slots import ResourceSlots
from corral.manager.up import UpConfig, UpReady, run_up

# Requests in a row that did not reach the sick replica: out of rotation (with least
# outstanding requests and round robin among equals, a replica in rotation answers every
# `replicas`-th request sent one after another).
MISSES_TO_CALL = 12
DEADLINE_S = 120.0
NAME = "failover"

REPLICA = """
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ["CORRAL_PORT"])
SICK = os.path.join(os.environ["SICK_DIR"], f"sick-{PORT}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        failing = self.path == "/health" and os.path.exists(SICK)
        body = str(PORT).encode()
        self.send_response(500 if failing else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
"""


def run_failover_bench(
    rounds: int, replicas: int, interval_s: float, failure_threshold: int
) -> dict[str, Any]:
    """Run the rounds; the figures as one JSON-ready dict."""
    return asyncio.run(_bench(rounds, replicas, interval_s, failure_threshold))


async def _bench(
    rounds: int, replicas: int, interval_s: float, failure_threshold: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="corral-failover-") as scratch:
        root = Path(scratch)
        config = UpConfig(
            data_dir=root / "data",
            slots=ResourceSlots.parse("cpu=8 mem=8g"),
            port=0,
            proxy_port=0,
        )
        stop = asyncio.Event()
        ready: asyncio.Future[UpReady] = asyncio.get_running_loop().create_future()
        running = asyncio.create_task(run_up(config, ready.set_result, stop))
        either: set[asyncio.Future[Any]] = {running, ready}
        await asyncio.wait(either, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            running.result()  # raises what stopped it
        try:
            up = ready.result()
            took = await _rounds(up, root, rounds, replicas, interval_s, failure_threshold)
        finally:
            stop.set()
            await running
    bound_s = failure_threshold * interval_s + 1.0
    return {
        "benchmark": "failover",
        "replicas": replicas,
        "interval_s": interval_s,
        "failure_threshold": failure_threshold,
        "rounds": rounds,
        "out_of_rotation_s": [round(t, 3) for t in took],
        "p50_s": round(percentile(took, 0.5), 3),
        "max_s": round(max(took), 3),
        "bound_s": bound_s,
        "within_bound": max(took) <= bound_s,
    }


async def _rounds(
    up: UpReady,
    root: Path,
    rounds: int,
    replicas: int,
    interval_s: float,
    failure_threshold: int,
) -> list[float]:
    assert up.proxy_url is not None
    server = root / "replica.py"
    server.write_text(REPLICA)
    spec = {
        "name": NAME,
        "image": "python",
        "command": ["python", str(server)],
        "env": {"SICK_DIR": str(root)},
        "resources": {"cpu": "0.25", "mem": "64m"},
        "replicas": replicas,
        "access": "open",
        "health_check": {
            "interval_s": interval_s,
            "failure_threshold": failure_threshold,
            "success_threshold": 1,
        },
    }
    headers = {"Authorization": f"Bearer {up.admin_token}"}
    took: list[float] = []
    async with (
        httpx.AsyncClient(base_url=up.url, headers=headers, timeout=30) as api,
        httpx.AsyncClient(base_url=up.proxy_url, timeout=30) as proxy,
    ):
        created = await api.post("/v1/deployments", json=spec)
        if created.status_code != 201:
            raise RuntimeError(f"creating the deployment answered {created.text}")
        for _ in range(rounds):
            ports = await _serving(proxy, replicas)
            sick = ports[0]
            (root / f"sick-{sick}").touch()
            took.append(await _out_of_rotation(proxy, sick))
    return took


async def _answer(proxy: httpx.AsyncClient) -> int | None:
    """The port of the replica that answered a request through the proxy (None: no answer)."""
    try:
        answer = await proxy.get(f"/{NAME}/")
    except httpx.TransportError:
        return None
    return int(answer.text) if answer.status_code == 200 else None


async def _serving(proxy: httpx.AsyncClient, replicas: int) -> list[int]:
    """Wait until `replicas` distinct replicas answer through the proxy; their ports."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        seen = {await _answer(proxy) for _ in range(4 * replicas)} - {None}
        if len(seen) >= replicas:
            return sorted(p for p in seen if p is not None)
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{replicas} replicas did not serve within {DEADLINE_S} s")


async def _out_of_rotation(proxy: httpx.AsyncClient, sick: int) -> float:
    """Seconds from marking `sick` until the proxy stopped sending it requests."""
    marked = time.monotonic()
    end = marked + DEADLINE_S
    misses = 0
    first_miss = marked
    while time.monotonic() < end:
        sent = time.monotonic()
        if await _answer(proxy) == sick:
            misses = 0
            continue
        if misses == 0:
            first_miss = sent
        misses += 1
        if misses >= MISSES_TO_CALL:
            return first_miss - marked
    raise RuntimeError(f"replica {sick} still served {DEADLINE_S} s after failing its checks")
