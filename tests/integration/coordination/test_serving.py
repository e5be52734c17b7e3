"""The deployment and route coordinators over a real database (both backends) and test agents:
replicas are INFERENCE sessions created and ended through the session controller."""

from __future__ import annotations

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import sqlalchemy as sa

from corral.controller.deployments import DeploymentController
from corral.coordination.metrics import CoordinatorMetrics
from corral.coordination.serving import (
    DEPLOYMENT_CHANGED,
    ROUTE_CHANGED,
    DeploymentCoordinator,
    RouteCoordinator,
    serving_coordinators,
)
from corral.domain.deployment import DeploymentSpec
from corral.domain.status import EndpointLifecycle, RouteStatus, SessionStatus
from corral.store.assignments import AssignedKernel
from corral.store.deployments import read_deployments, read_route_table, read_routes
from corral.store.events import read_events
from corral.store.tables import kernels, sessions
from tests.integration.coordination._harness import Cluster, make_cluster

CAPACITY = [{"cpu": 8000, "mem": 16 * 1024**3 * 1000}]


def _address(kernel: AssignedKernel) -> tuple[str, int]:
    return ("127.0.0.1", 20000 + kernel.cluster_index)


class Serving:
    """A cluster with both serving coordinators, driven round by round until nothing moves."""

    def __init__(
        self,
        cluster: Cluster,
        start_timeout_s: float = 900.0,
        metrics: CoordinatorMetrics | None = None,
    ) -> None:
        self.cluster = cluster
        self.deployments: DeploymentCoordinator
        self.routes: RouteCoordinator
        self.deployments, self.routes = serving_coordinators(
            cluster.db,
            cluster.hints,
            cluster.events,
            cluster.controller,
            clock=cluster.clock,
            start_timeout_s=start_timeout_s,
            metrics=metrics,
        )
        self.controller = DeploymentController(
            cluster.db, cluster.hints, cluster.events, clock=cluster.clock
        )

    async def settle(self, max_rounds: int = 60) -> None:
        for _ in range(max_rounds):
            moved = 0
            for task in [*self.deployments.tasks(), *self.routes.tasks()]:
                moved += (await task.run()).changed
            moved += await self.cluster.coordinator.run_all()
            moved += await self.cluster.agent.step()
            if not moved:
                return
        raise AssertionError(f"still moving after {max_rounds} rounds")

    async def create(self, replicas: int, **fields: Any) -> uuid.UUID:
        spec = DeploymentSpec.model_validate(
            {
                "name": "llm",
                "image": "python",
                "command": ["python", "-m", "http.server"],
                "resources": {"cpu": "1", "mem": "1g"},
                "replicas": replicas,
                **fields,
            }
        )
        return (await self.controller.create(spec, self.cluster.owner)).id

    async def deployment(self, deployment_id: uuid.UUID) -> dict[str, Any]:
        async with self.cluster.db.read() as conn:
            (found,) = await read_deployments(conn, ids=[deployment_id])
            found["routes"] = await read_routes(conn, deployment_ids=[deployment_id])
        return found


def _statuses(found: dict[str, Any]) -> list[str]:
    return sorted(r["status"] for r in found["routes"])


async def _session_statuses(cluster: Cluster, route_rows: list[dict[str, Any]]) -> list[str]:
    ids = [r["session_id"] for r in route_rows]
    async with cluster.db.read() as conn:
        rows = await conn.execute(
            sa.select(sessions.c.status, sessions.c.type).where(sessions.c.id.in_(ids))
        )
        found = [tuple(r) for r in rows]
    assert all(kind == "INFERENCE" for _, kind in found)
    return sorted(status for status, _ in found)


async def test_replicas_come_up_as_inference_sessions_and_scale(db: Any) -> None:
    """2 replicas: PENDING → SCALING → READY, two routes DEGRADED with their agents' addresses,
    each an INFERENCE session RUNNING; scaling 2 → 3 → 1 adds and ends replicas."""
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = _address
    serving = Serving(cluster)
    deployment_id = await serving.create(2)
    await serving.settle()
    found = await serving.deployment(deployment_id)
    assert found["lifecycle"] == EndpointLifecycle.READY
    assert _statuses(found) == [RouteStatus.DEGRADED] * 2
    assert all((r["host"], r["port"]) == ("127.0.0.1", 20000) for r in found["routes"])
    assert await _session_statuses(cluster, found["routes"]) == [SessionStatus.RUNNING] * 2

    await serving.controller.scale(found, 3)
    await serving.settle()
    found = await serving.deployment(deployment_id)
    assert found["lifecycle"] == EndpointLifecycle.READY
    assert _statuses(found) == [RouteStatus.DEGRADED] * 3

    await serving.controller.scale(found, 1)
    await serving.settle()
    found = await serving.deployment(deployment_id)
    assert _statuses(found) == sorted([RouteStatus.DEGRADED] + [RouteStatus.TERMINATED] * 2)
    scaled_down = [
        e.payload["reason"]
        for e in await read_events(db, after_id=0, limit=1000)
        if e.kind == ROUTE_CHANGED and e.payload["phase"] == "ScalingDeployment"
    ]
    assert scaled_down == ["scaled down to 1"] * 2
    assert sorted(await _session_statuses(cluster, found["routes"])) == sorted(
        [SessionStatus.RUNNING] + [SessionStatus.TERMINATED] * 2
    )
    events = await read_events(db, after_id=0, limit=1000)
    changes = [(e.payload["from"], e.payload["to"]) for e in events if e.kind == DEPLOYMENT_CHANGED]
    assert changes[:2] == [("pending", "scaling"), ("scaling", "ready")]
    assert any(e.kind == ROUTE_CHANGED for e in events)


async def test_a_replica_that_ends_is_replaced(db: Any) -> None:
    """A replica session that ends takes its route to TERMINATING then TERMINATED, and the
    deployment provisions a replacement."""
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = _address
    serving = Serving(cluster)
    deployment_id = await serving.create(2)
    await serving.settle()
    first = (await serving.deployment(deployment_id))["routes"][0]
    async with db.read() as conn:
        kernel_ids = list(
            await conn.scalars(
                sa.select(kernels.c.id).where(kernels.c.session_id == first["session_id"])
            )
        )
    await cluster.agent.exit(kernel_ids, exit_code=1)
    await serving.settle()
    found = await serving.deployment(deployment_id)
    by_id = {r["id"]: r for r in found["routes"]}
    assert by_id[first["id"]]["status"] == RouteStatus.TERMINATED
    assert _statuses(found) == sorted([RouteStatus.DEGRADED] * 2 + [RouteStatus.TERMINATED])
    assert found["lifecycle"] == EndpointLifecycle.READY


async def test_destroy_ends_every_route_and_session(db: Any) -> None:
    """Destroy: DESTROYING → DESTROYED with every route TERMINATED and every session ended."""
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = _address
    serving = Serving(cluster)
    deployment_id = await serving.create(2)
    await serving.settle()
    assert await serving.controller.destroy(await serving.deployment(deployment_id))
    assert (await serving.deployment(deployment_id))["lifecycle"] == EndpointLifecycle.DESTROYING
    await serving.settle()
    found = await serving.deployment(deployment_id)
    assert found["lifecycle"] == EndpointLifecycle.DESTROYED
    assert _statuses(found) == [RouteStatus.TERMINATED] * 2
    assert await _session_statuses(cluster, found["routes"]) == [SessionStatus.TERMINATED] * 2
    events = await read_events(db, after_id=0, limit=1000)
    ended = [
        (e.payload["from"], e.payload["to"], e.payload["phase"])
        for e in events
        if e.kind == ROUTE_CHANGED and e.payload["to"] == "terminating"
    ]
    assert ended == [("degraded", "terminating", "DestroyingDeployment")] * 2


async def test_a_replica_that_never_starts_fails_to_start_and_is_replaced(db: Any) -> None:
    """A replica whose session never runs within the start timeout: FAILED_TO_START →
    TERMINATING → TERMINATED (its session cancelled), and a replacement is provisioned."""
    cluster = await make_cluster(db, CAPACITY)
    cluster.agent.address = _address
    cluster.agent.unresponsive = set(cluster.agents)
    serving = Serving(cluster, start_timeout_s=60)
    deployment_id = await serving.create(1)
    await serving.settle()
    (route,) = (await serving.deployment(deployment_id))["routes"]
    assert route["status"] == RouteStatus.PROVISIONING
    cluster.clock.advance(61)
    cluster.agent.unresponsive = set()  # the agent answers again: it stops the old replica
    await serving.settle()
    found = await serving.deployment(deployment_id)
    by_id = {r["id"]: r for r in found["routes"]}
    assert by_id[route["id"]]["status"] == RouteStatus.TERMINATED
    assert _statuses(found) == [RouteStatus.DEGRADED, RouteStatus.TERMINATED]
    assert await _session_statuses(cluster, found["routes"]) == [
        SessionStatus.CANCELLED,
        SessionStatus.RUNNING,
    ]
    events = await read_events(db, after_id=0, limit=1000)
    route_moves = [
        (e.payload["from"], e.payload["to"])
        for e in events
        if e.kind == ROUTE_CHANGED and e.entity_id == str(route["id"])
    ]
    assert route_moves == [
        ("provisioning", "failed_to_start"),
        ("failed_to_start", "terminating"),
        ("terminating", "terminated"),
    ]


class _Replica(ThreadingHTTPServer):
    healthy = True


class _Handler(BaseHTTPRequestHandler):
    server: _Replica

    def do_GET(self) -> None:
        status = 200 if self.server.healthy or self.path != "/health" else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class Replicas:
    """Real local HTTP servers, one per replica kernel, whose health endpoint can fail."""

    def __init__(self) -> None:
        self.by_kernel: dict[uuid.UUID, _Replica] = {}
        self._threads: list[threading.Thread] = []

    def address(self, kernel: AssignedKernel) -> tuple[str, int]:
        server = self.by_kernel.get(kernel.id)
        if server is None:
            server = self.by_kernel[kernel.id] = _Replica(("127.0.0.1", 0), _Handler)
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            self._threads.append(thread)
        return ("127.0.0.1", server.server_address[1])

    def at(self, port: int) -> _Replica:
        (server,) = [s for s in self.by_kernel.values() if s.server_address[1] == port]
        return server

    def close(self) -> None:
        for server in self.by_kernel.values():
            server.shutdown()
            server.server_close()


async def test_health_checks_make_routes_healthy_and_evict_a_failing_one(db: Any) -> None:
    """Real HTTP replicas: probes make both routes HEALTHY; one whose /health starts failing
    becomes UNHEALTHY at the failure threshold, is evicted and TERMINATED, and a replacement
    becomes HEALTHY; the failed probes are counted in the manager's metrics."""
    cluster = await make_cluster(db, CAPACITY)
    replicas = Replicas()
    cluster.agent.address = replicas.address
    metrics = CoordinatorMetrics()
    serving = Serving(cluster, metrics=metrics)
    check = {"interval_s": 5, "failure_threshold": 2, "success_threshold": 1, "timeout_s": 2}
    try:
        deployment_id = await serving.create(2, health_check=check)
        await serving.settle()
        found = await serving.deployment(deployment_id)
        assert _statuses(found) == [RouteStatus.HEALTHY] * 2
        assert all(r["health_info"].startswith("200 in ") for r in found["routes"])
        async with db.read() as conn:
            revision, table = await read_route_table(conn)
        assert revision > 0
        assert sorted(r["port"] for r in table) == sorted(r["port"] for r in found["routes"])

        bad = found["routes"][0]
        replicas.at(bad["port"]).healthy = False
        cluster.clock.advance(5)
        await serving.settle()
        route = {r["id"]: r for r in (await serving.deployment(deployment_id))["routes"]}[bad["id"]]
        assert (route["status"], route["consecutive_failures"]) == (RouteStatus.HEALTHY, 1)
        assert route["health_info"].startswith("503 in ")
        cluster.clock.advance(5)
        await serving.settle()
        found = await serving.deployment(deployment_id)
        route = {r["id"]: r for r in found["routes"]}[bad["id"]]
        assert route["status"] == RouteStatus.UNHEALTHY  # out of rotation
        assert metrics.registry.get_sample_value("corral_route_probe_failures_total") == 2
        for _ in range(2):
            cluster.clock.advance(5)
            await serving.settle()
        found = await serving.deployment(deployment_id)
        route = {r["id"]: r for r in found["routes"]}[bad["id"]]
        assert route["status"] == RouteStatus.TERMINATED
        assert _statuses(found) == sorted([RouteStatus.HEALTHY] * 2 + [RouteStatus.TERMINATED])
        async with db.read() as conn:
            later, table = await read_route_table(conn)
        assert later > revision  # the table changed twice: the bad one out, its replacement in
        assert bad["port"] not in {r["port"] for r in table}
        assert len(table) == 2
        events = await read_events(db, after_id=0, limit=1000)
        moves = [
            (e.payload["from"], e.payload["to"])
            for e in events
            if e.kind == ROUTE_CHANGED and e.entity_id == str(bad["id"])
        ]
        assert moves == [
            ("provisioning", "degraded"),
            ("degraded", "healthy"),
            ("healthy", "unhealthy"),
            ("unhealthy", "terminating"),
            ("terminating", "terminated"),
        ]
    finally:
        replicas.close()


class _Health:
    """Replicas' health by their spec: a replica whose env has BROKEN=1 fails its probes."""

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas

    def address(self, kernel: AssignedKernel) -> tuple[str, int]:
        address = self.replicas.address(kernel)
        env = (kernel.spec.get("env") or {}) if isinstance(kernel.spec, dict) else {}
        self.replicas.by_kernel[kernel.id].healthy = env.get("BROKEN") != "1"
        return address


async def _rolled(
    serving: Serving, deployment_id: uuid.UUID, floor: int, rounds: int = 40
) -> dict[str, Any]:
    """Drive the update (the clock moving a probe interval a round) until the deployment is
    READY again, checking at every round that at least `floor` replicas stay HEALTHY."""
    for _ in range(rounds):
        serving.cluster.clock.advance(5)
        await serving.settle()
        found = await serving.deployment(deployment_id)
        healthy = sum(r["status"] == RouteStatus.HEALTHY for r in found["routes"])
        assert healthy >= floor, _statuses(found)
        if found["lifecycle"] == EndpointLifecycle.READY:
            return found
    raise AssertionError("the update did not finish")


async def test_a_rolling_update_replaces_every_replica_keeping_them_healthy(db: Any) -> None:
    """An update (new command) brings up new replicas before taking old ones out: never
    fewer healthy than replicas - max_unavailable; READY with only new-revision replicas."""
    cluster = await make_cluster(db, CAPACITY)
    replicas = Replicas()
    cluster.agent.address = _Health(replicas).address
    serving = Serving(cluster)
    try:
        deployment_id = await serving.create(2, health_check={"interval_s": 5})
        await serving.settle()
        before = await serving.deployment(deployment_id)
        assert _statuses(before) == [RouteStatus.HEALTHY] * 2
        spec = DeploymentSpec.model_validate(before["replica_spec"])
        new = spec.model_copy(update={"command": ["python", "-m", "v2"]})
        assert await serving.controller.update(before, new) == 1
        found = await _rolled(serving, deployment_id, floor=2)
        live = [r for r in found["routes"] if r["status"] != RouteStatus.TERMINATED]
        assert [(r["status"], r["revision"]) for r in live] == [(RouteStatus.HEALTHY, 1)] * 2
        assert found["replica_spec"]["command"] == ["python", "-m", "v2"]
        old = {r["id"] for r in before["routes"]}
        assert {r["status"] for r in found["routes"] if r["id"] in old} == {RouteStatus.TERMINATED}
    finally:
        replicas.close()


async def test_an_update_that_never_serves_is_rolled_back(db: Any) -> None:
    """A new version whose replicas fail their probes is rolled back: the old replicas keep
    serving throughout, the new ones are taken out, the old spec is current again."""
    cluster = await make_cluster(db, CAPACITY)
    replicas = Replicas()
    cluster.agent.address = _Health(replicas).address
    serving = Serving(cluster)
    try:
        deployment_id = await serving.create(
            2, health_check={"interval_s": 5, "failure_threshold": 1}
        )
        await serving.settle()
        before = await serving.deployment(deployment_id)
        spec = DeploymentSpec.model_validate(before["replica_spec"])
        broken = spec.model_copy(update={"env": {"BROKEN": "1"}})
        await serving.controller.update(before, broken)
        found = await _rolled(serving, deployment_id, floor=2)
        assert found["replica_spec"]["env"] == {}
        old = {r["id"] for r in before["routes"]}
        by_id = {r["id"]: r for r in found["routes"]}
        assert {by_id[i]["status"] for i in old} == {RouteStatus.HEALTHY}
        assert {r["status"] for r in found["routes"] if r["id"] not in old} == {
            RouteStatus.TERMINATED
        }
        kinds = [e.kind for e in await read_events(db, after_id=0, limit=1000)]
        assert "deployment.rolled_back" in kinds
    finally:
        replicas.close()
