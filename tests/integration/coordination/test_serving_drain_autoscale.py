"""Draining, proxies' load reports, autoscaling and the handlers' history, over a real database
(both backends), test agents, real local HTTP servers as replicas and the real proxy app:
a replica taken out gets no new request and ends when its requests in flight have (or at its
grace period); the replica count follows the requests in flight within its bounds."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from corral.domain.deployment import DEPLOYMENT_AUTOSCALED, DeploymentSpec
from corral.domain.status import EndpointLifecycle, RouteStatus, SessionStatus
from corral.proxy.forward import ProxyApp
from corral.proxy.table import RouteTable, TableEntry
from corral.store.assignments import AssignedKernel
from corral.store.deployments import read_route_table
from corral.store.events import read_events
from corral.store.proxy_reports import write_proxy_report
from corral.store.serving_history import read_deployment_history, read_route_history
from tests.integration.coordination._harness import make_cluster
from tests.integration.coordination.test_serving import CAPACITY, Serving, _address

CHECK = {"interval_s": 5, "failure_threshold": 2, "success_threshold": 1, "timeout_s": 2}


class _Replica(ThreadingHTTPServer):
    """A replica counting the requests it got (health probes aside); `/slow` answers only once
    `release` is set."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.served = 0
        self.in_flight = 0
        self.release = threading.Event()
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: _Replica

    def do_GET(self) -> None:
        if self.path != "/health":
            with self.server.lock:
                self.server.served += 1
                self.server.in_flight += 1
            if self.path == "/slow":
                self.server.release.wait(timeout=60)
            with self.server.lock:
                self.server.in_flight -= 1
        with contextlib.suppress(OSError):  # a test that ended closed the connection
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


class _Replicas:
    def __init__(self) -> None:
        self.by_kernel: dict[uuid.UUID, _Replica] = {}

    def address(self, kernel: AssignedKernel) -> tuple[str, int]:
        server = self.by_kernel.get(kernel.id)
        if server is None:
            server = self.by_kernel[kernel.id] = _Replica()
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return ("127.0.0.1", server.server_address[1])

    def at(self, port: int) -> _Replica:
        (server,) = [s for s in self.by_kernel.values() if s.server_address[1] == port]
        return server

    def close(self) -> None:
        for server in self.by_kernel.values():
            server.release.set()
            server.shutdown()
            server.server_close()


class _Proxy:
    """The real proxy app on a route table read from the store, reporting as a proxy does."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.table = RouteTable()
        self.app = ProxyApp(self.table)
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://proxy", timeout=60
        )

    async def sync(self) -> None:
        """Follow the route table, then report the requests in flight (as `corral proxy`)."""
        db = self.serving.cluster.db
        async with db.read() as conn:
            revision, rows = await read_route_table(conn)
        by_deployment: dict[uuid.UUID, tuple[str, list[str]]] = {}
        for row in rows:
            entry = by_deployment.setdefault(row["deployment_id"], (row["name"], []))
            entry[1].append(f"{row['host']}:{row['port']}")
        self.table.replace(
            revision,
            [TableEntry(str(d), name, addresses) for d, (name, addresses) in by_deployment.items()],
        )
        async with db.transaction() as conn:
            await write_proxy_report(
                conn, "proxy-1", revision, self.table.inflight(), self.serving.cluster.clock()
            )

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.app.aclose()


@pytest.fixture
async def replicas() -> AsyncIterator[_Replicas]:
    found = _Replicas()
    yield found
    found.close()


async def _until(condition: Callable[[], bool], what: str, deadline_s: float = 10.0) -> None:
    """Wait (polling, with a deadline) for a replica thread to get somewhere."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _two_healthy_behind_a_proxy(
    db: Any, replicas: _Replicas, **fields: Any
) -> tuple[Serving, uuid.UUID, _Proxy]:
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = replicas.address
    serving = Serving(cluster)
    deployment_id = await serving.create(2, health_check=CHECK, **fields)
    await serving.settle()
    found = await serving.deployment(deployment_id)
    assert sorted(r["status"] for r in found["routes"]) == [RouteStatus.HEALTHY] * 2
    proxy = _Proxy(serving)
    await proxy.sync()
    return serving, deployment_id, proxy


async def _scale_to_one_with_a_request_in_flight_on_each(
    serving: Serving, deployment_id: uuid.UUID, proxy: _Proxy, replicas: _Replicas
) -> tuple[dict[str, Any], dict[str, Any], list[asyncio.Task[httpx.Response]]]:
    """One slow request in flight on each replica, then a scale to 1: (the draining route,
    the one kept, the slow requests)."""
    slow = [asyncio.create_task(proxy.http.get("/llm/slow")) for _ in range(2)]
    servers = list(replicas.by_kernel.values())
    await _until(lambda: all(s.in_flight == 1 for s in servers), "a slow request on each")
    await proxy.sync()
    await serving.controller.scale(await serving.deployment(deployment_id), 1)
    await serving.settle()
    found = await serving.deployment(deployment_id)
    (draining,) = [r for r in found["routes"] if r["status"] == RouteStatus.TERMINATING]
    (kept,) = [r for r in found["routes"] if r["status"] == RouteStatus.HEALTHY]
    assert draining["drain_until"] is not None
    assert found["lifecycle"] == EndpointLifecycle.READY
    return draining, kept, slow


async def test_a_scale_down_drains_the_replica_before_ending_it(
    db: Any, replicas: _Replicas
) -> None:
    """Scale 2 → 1 with a request in flight on each replica: the one taken out leaves the
    proxy's table (no new request reaches it) but keeps its session until its request has
    ended and the proxy reported so; then its route is TERMINATED. History rows record it."""
    serving, deployment_id, proxy = await _two_healthy_behind_a_proxy(db, replicas)
    try:
        draining, kept, slow = await _scale_to_one_with_a_request_in_flight_on_each(
            serving, deployment_id, proxy, replicas
        )
        await proxy.sync()  # the proxy follows the table without the draining replica
        await serving.settle()
        found = await serving.deployment(deployment_id)
        route = {r["id"]: r for r in found["routes"]}[draining["id"]]
        assert route["status"] == RouteStatus.TERMINATING
        assert route["session_status"] == SessionStatus.RUNNING  # still serving its request
        out = replicas.at(draining["port"])
        before = out.served
        answers = [await proxy.http.get("/llm/fast") for _ in range(6)]
        assert [a.status_code for a in answers] == [200] * 6
        assert out.served == before  # no new request reached the draining replica
        assert replicas.at(kept["port"]).served == 1 + 6

        out.release.set()  # its request in flight ends
        await _until(lambda: out.in_flight == 0, "the draining replica's request to end")
        done, _ = await asyncio.wait(slow, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert [t.result().status_code for t in done] == [200]
        await proxy.sync()
        await serving.settle()
        found = await serving.deployment(deployment_id)
        route = {r["id"]: r for r in found["routes"]}[draining["id"]]
        assert route["status"] == RouteStatus.TERMINATED
        assert route["session_status"] == SessionStatus.TERMINATED

        async with db.read() as conn:
            own = await read_deployment_history(conn, deployment_id)
            of_routes = await read_route_history(conn, deployment_id)
        assert [(h["phase"], h["from_status"], h["to_status"], h["result"]) for h in own][:2] == [
            ("CheckPendingDeployment", "pending", "scaling", "SUCCESS"),
            ("ScalingDeployment", "scaling", "ready", "SUCCESS"),
        ]
        moves = [
            (h["phase"], h["from_status"], h["to_status"], h["result"])
            for h in of_routes
            if h["route_id"] == draining["id"] and h["to_status"] is not None
        ]
        assert moves == [
            ("ProvisioningRoute", "provisioning", "degraded", "SUCCESS"),
            ("HealthCheckRoute", "degraded", "healthy", "SUCCESS"),
            ("ScalingDeployment", "healthy", "terminating", "SUCCESS"),
            ("TerminatingRoute", "terminating", "terminated", "SUCCESS"),
        ]
    finally:
        for server in replicas.by_kernel.values():
            server.release.set()
        await proxy.aclose()


async def test_a_drain_ends_at_its_grace_period(db: Any, replicas: _Replicas) -> None:
    """A replica whose request never ends is ended once its drain grace has passed."""
    serving, deployment_id, proxy = await _two_healthy_behind_a_proxy(
        db, replicas, drain_grace_s=20
    )
    try:
        draining, _, _ = await _scale_to_one_with_a_request_in_flight_on_each(
            serving, deployment_id, proxy, replicas
        )
        await proxy.sync()
        serving.cluster.clock.advance(19)
        await proxy.sync()
        await serving.settle()
        route = {r["id"]: r for r in (await serving.deployment(deployment_id))["routes"]}
        assert route[draining["id"]]["status"] == RouteStatus.TERMINATING
        serving.cluster.clock.advance(2)
        await proxy.sync()
        await serving.settle()
        route = {r["id"]: r for r in (await serving.deployment(deployment_id))["routes"]}
        assert route[draining["id"]]["status"] == RouteStatus.TERMINATED
    finally:
        for server in replicas.by_kernel.values():
            server.release.set()
        await proxy.aclose()


async def test_a_proxy_that_stops_reporting_ages_out(db: Any, replicas: _Replicas) -> None:
    """A proxy's last report counts only while fresh: a proxy gone does not hold a drain."""
    serving, deployment_id, proxy = await _two_healthy_behind_a_proxy(db, replicas)
    try:
        draining, _, _ = await _scale_to_one_with_a_request_in_flight_on_each(
            serving, deployment_id, proxy, replicas
        )
        await proxy.sync()
        await serving.settle()
        route = {r["id"]: r for r in (await serving.deployment(deployment_id))["routes"]}
        assert route[draining["id"]]["status"] == RouteStatus.TERMINATING
        serving.cluster.clock.advance(6)  # past the report TTL, within the 30 s grace
        await serving.settle()
        route = {r["id"]: r for r in (await serving.deployment(deployment_id))["routes"]}
        assert route[draining["id"]]["status"] == RouteStatus.TERMINATED
    finally:
        for server in replicas.by_kernel.values():
            server.release.set()
        await proxy.aclose()


async def _report(serving: Serving, deployment_id: uuid.UUID, inflight: int) -> None:
    async with serving.cluster.db.transaction() as conn:
        await write_proxy_report(
            conn,
            "proxy-1",
            0,
            {str(deployment_id): {"127.0.0.1:20000": inflight}},
            serving.cluster.clock(),
        )


async def test_autoscaling_follows_the_requests_in_flight_within_bounds(
    db: Any, replicas: _Replicas
) -> None:
    """target 2 in flight per replica, 1..3 replicas: 5 in flight → 3 once the up delay held,
    9 in flight → still 3 (the max), 0 → 1 (the min) only after the down delay; each change an
    event, a SCALING and READY again."""
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = replicas.address
    serving = Serving(cluster)
    policy = {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_inflight": 2,
        "upscale_delay_s": 10,
        "downscale_delay_s": 60,
    }
    deployment_id = await serving.create(1, autoscaling=policy, health_check=CHECK)
    await serving.settle()

    async def replicas_after(inflight: int, advance_s: float) -> tuple[int, int]:
        cluster.clock.advance(advance_s)
        await _report(serving, deployment_id, inflight)
        await serving.settle()
        found = await serving.deployment(deployment_id)
        live = sum(r["status"] == RouteStatus.HEALTHY for r in found["routes"])
        assert found["lifecycle"] == EndpointLifecycle.READY
        return found["desired_replicas"], live

    assert await replicas_after(5, 5) == (1, 1)  # wanted 3: the up delay starts
    found = await serving.deployment(deployment_id)
    assert found["autoscale_wanted"] == 3
    assert await replicas_after(5, 5) == (1, 1)
    assert (await replicas_after(5, 5))[0] == 3  # held 10 s: the new ones come up
    assert await replicas_after(5, 5) == (3, 3)
    assert await replicas_after(9, 30) == (3, 3)  # the max
    assert await replicas_after(0, 1) == (3, 3)  # wanted 1: the down delay starts
    assert await replicas_after(0, 59) == (3, 3)
    assert await replicas_after(0, 1) == (1, 1)  # held 60 s; never below the min
    scaled = [
        (e.payload["from"], e.payload["to"])
        for e in await read_events(db, after_id=0, limit=1000)
        if e.kind == DEPLOYMENT_AUTOSCALED
    ]
    assert scaled == [(1, 3), (3, 1)]
    async with db.read() as conn:
        own = await read_deployment_history(conn, deployment_id)
    assert [h["to_status"] for h in own if h["phase"] == "AutoscaleDeployment"] == ["scaling"] * 2


async def test_autoscaling_without_reports_changes_nothing(db: Any) -> None:
    """No live proxy: the load is unknown, the replica count stays."""
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = _address
    serving = Serving(cluster)
    policy = {"min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 0}
    deployment_id = await serving.create(2, autoscaling=policy)
    await serving.settle()
    cluster.clock.advance(3600)
    await serving.settle()
    assert (await serving.deployment(deployment_id))["desired_replicas"] == 2


async def test_a_rolling_updates_old_replicas_drain(db: Any, replicas: _Replicas) -> None:
    """A rolling update takes the old replicas out by draining: the update completes (READY,
    only new replicas in the table) while the old ones finish their requests in flight; they
    end once those have."""
    serving, deployment_id, proxy = await _two_healthy_behind_a_proxy(
        db, replicas, drain_grace_s=600
    )
    try:
        old = {r["id"] for r in (await serving.deployment(deployment_id))["routes"]}
        slow = [asyncio.create_task(proxy.http.get("/llm/slow")) for _ in range(2)]
        servers = list(replicas.by_kernel.values())
        await _until(lambda: all(s.in_flight == 1 for s in servers), "a slow request on each")
        await proxy.sync()
        before = await serving.deployment(deployment_id)
        spec = DeploymentSpec.model_validate(before["replica_spec"])
        await serving.controller.update(
            before, spec.model_copy(update={"command": ["python", "-m", "v2"]})
        )
        for _ in range(40):
            serving.cluster.clock.advance(5)
            await proxy.sync()
            await serving.settle()
            found = await serving.deployment(deployment_id)
            if found["lifecycle"] == EndpointLifecycle.READY:
                break
        else:
            raise AssertionError("the update did not finish")
        by_id = {r["id"]: r for r in found["routes"]}
        assert {(by_id[i]["status"], by_id[i]["session_status"]) for i in old} == {
            (RouteStatus.TERMINATING, SessionStatus.RUNNING)
        }
        for server in servers:
            server.release.set()
        await asyncio.gather(*slow)
        await proxy.sync()
        await serving.settle()
        by_id = {r["id"]: r for r in (await serving.deployment(deployment_id))["routes"]}
        assert {by_id[i]["status"] for i in old} == {RouteStatus.TERMINATED}
    finally:
        for server in replicas.by_kernel.values():
            server.release.set()
        await proxy.aclose()
