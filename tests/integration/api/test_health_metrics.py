"""`/healthz`, `/readyz` and `/metrics` over HTTP (the real app in-process), on both backends."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from corral.api import health
from corral.api.app import ApiContext, create_app
from corral.coordination.loop import DualLoop
from corral.coordination.metrics import CoordinatorMetrics
from corral.coordination.tasks import Task, TaskRun
from corral.domain.results import SchedulingResult
from corral.domain.status import SessionStatus
from corral.infra.locks.memory import MemoryLockManager
from corral.scheduler.scheduler import schedule_group
from corral.store.database import Database
from corral.store.status_changes import StatusChange
from tests.integration.api.conftest import ApiWorld
from tests.integration.store._factories import NOW

NEVER_S = 3600.0  # a loop interval no test waits for
PROBE = "Probe"


def build_app(context: ApiContext, metrics: CoordinatorMetrics | None = None) -> FastAPI:
    """The manager's app, its /metrics fed by `metrics`."""
    return create_app(replace(context, metrics=metrics) if metrics is not None else context)


@asynccontextmanager
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on `app`, in-process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
        yield http


def context(
    world: ApiWorld, *, db: Database | None = None, loops: Sequence[DualLoop] = ()
) -> ApiContext:
    """The world's API context, with another database or loops when given."""
    return ApiContext(
        db=db or world.cluster.db,
        agents=world.agents,
        sessions=world.cluster.controller,
        events=world.cluster.events,
        loops=tuple(loops),
    )


class ProbeLoop:
    """A dual loop over a task that reports fixed figures; runs once per hint, never on a tick."""

    def __init__(self, world: ApiWorld) -> None:
        self.hints = world.cluster.hints
        self.ran = asyncio.Event()
        task = Task(PROBE, "probe", self._run)
        self.loop = DualLoop(
            task,
            self.hints,
            MemoryLockManager(),
            short_interval_s=NEVER_S,
            long_interval_s=NEVER_S,
            run_at_start=False,
        )
        self._runner: asyncio.Task[None] | None = None

    async def _run(self) -> TaskRun:
        self.ran.set()
        return TaskRun(PROBE, targets=3, changed=2, duration_ms=1.0)

    async def start_and_run_once(self) -> None:
        """Start the loop and return once its first run (woken by a hint) has completed."""
        await self.hints.set("probe")
        self._runner = asyncio.create_task(self.loop.run())
        # The loop counts and reports the run before it next waits, so before this resumes.
        await self.ran.wait()

    async def stop(self) -> None:
        """Stop the loop and wait for it to end."""
        self.loop.stop()
        if self._runner is not None:
            await self._runner


@asynccontextmanager
async def probe_loop(world: ApiWorld) -> AsyncIterator[ProbeLoop]:
    """A ProbeLoop, stopped at the end."""
    probe = ProbeLoop(world)
    try:
        yield probe
    finally:
        await probe.stop()


@contextmanager
def closed_port() -> Iterator[int]:
    """A local TCP port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    yield port


@contextmanager
def silent_server() -> Iterator[int]:
    """A local TCP port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


async def scrape(http: httpx.AsyncClient) -> dict[str, list[Sample]]:
    """GET /metrics, parsed: the samples of each family by family name."""
    response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def value(families: dict[str, list[Sample]], sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` with exactly these labels."""
    every = [s for samples in families.values() for s in samples]
    (found,) = [s.value for s in every if s.name == sample and s.labels == labels]
    return found


async def test_healthz_answers_without_a_token(world: ApiWorld) -> None:
    """Liveness is 200 {"status": "ok"} with no Authorization header."""
    async with client(build_app(context(world))) as http:
        response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_is_200_while_the_database_answers_and_the_loops_run(world: ApiWorld) -> None:
    """Ready with a reachable database and running loops; each check says what it found."""
    async with probe_loop(world) as probe:
        app = build_app(context(world, loops=[probe.loop]))
        await probe.start_and_run_once()
        async with client(app) as http:
            response = await http.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": "ready",
        "checks": {"database": "ok", "coordinator": "1 of 1 loops running"},
    }


async def test_readyz_is_503_when_the_loops_are_stopped_or_absent(world: ApiWorld) -> None:
    """A stopped loop, or none at all, makes readiness a 503 problem naming the coordinator."""
    async with probe_loop(world) as probe:
        app = build_app(context(world, loops=[probe.loop]))
        await probe.start_and_run_once()
        await probe.stop()
        async with client(app) as http:
            stopped = await http.get("/readyz")
    async with client(build_app(context(world))) as http:
        absent = await http.get("/readyz")
    for response, found in ((stopped, "0 of 1 loops running"), (absent, "0 of 0 loops running")):
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        body = response.json()
        assert body["type"].endswith("/not-ready")
        assert body["detail"] == f"coordinator: {found}"
        assert body["checks"] == {"database": "ok", "coordinator": found}


async def test_readyz_is_503_when_the_database_refuses_connections(world: ApiWorld) -> None:
    """A database on a closed port fails the database check; the reply names no host or port."""
    with closed_port() as port:
        unreachable = Database.open(f"postgresql://corral@127.0.0.1:{port}/corral")
        try:
            async with probe_loop(world) as probe:
                app = build_app(context(world, db=unreachable, loops=[probe.loop]))
                await probe.start_and_run_once()
                async with client(app) as http:
                    response = await http.get("/readyz")
        finally:
            await unreachable.close()
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["type"].endswith("/not-ready")
    assert body["checks"]["coordinator"] == "1 of 1 loops running"
    assert body["checks"]["database"].startswith("unavailable (")
    assert body["detail"].startswith("database: unavailable (")
    assert str(port) not in response.text


async def test_readyz_gives_up_on_a_database_that_does_not_answer(
    world: ApiWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts but never answers is a 503 once the (shortened) timeout passes."""
    monkeypatch.setattr(health, "DATABASE_TIMEOUT_S", 0.2)
    with silent_server() as port:
        silent = Database.open(f"postgresql://corral@127.0.0.1:{port}/corral")
        try:
            async with client(build_app(context(world, db=silent))) as http:
                response = await http.get("/readyz")
        finally:
            await silent.close()
    assert response.status_code == 503, response.text
    assert response.json()["checks"]["database"] == "no answer within 0.2 s"


async def test_metrics_count_sessions_by_status_after_the_coordinator_ran(world: ApiWorld) -> None:
    """corral_sessions matches the sessions' statuses, every status present, zeros included."""
    cluster = world.cluster
    ids = [await cluster.submit() for _ in range(10)]  # the agent has 8 cpu: 2 stay PENDING
    ids.append(await cluster.submit(resources={"cpu": "100"}))  # never fits: cancelled
    await cluster.coordinator.run_all()
    expected = Counter([(await cluster.status(sid)).value for sid in ids])
    assert len(expected) >= 3, expected  # the test means something only with several statuses
    async with client(build_app(context(world))) as http:
        families = await scrape(http)
    by_status = {s.labels["status"]: s.value for s in families["corral_sessions"]}
    assert by_status == {status.value: expected.get(status.value, 0) for status in SessionStatus}
    agents = {s.labels["status"]: s.value for s in families["corral_agents"]}
    assert agents == {"ALIVE": len(cluster.agents), "LOST": 0, "TERMINATED": 0}
    assert value(families, "corral_database_up") == 1


async def test_metrics_report_the_loops_runs_and_their_durations(world: ApiWorld) -> None:
    """A hinted run shows in the loop counters, the duration histogram and the totals."""
    async with probe_loop(world) as probe:
        app = build_app(context(world, loops=[probe.loop]))
        await probe.start_and_run_once()
        async with client(app) as http:
            running = await scrape(http)
        await probe.stop()
        async with client(app) as http:
            stopped = await scrape(http)
    runs = "corral_coordinator_task_runs_total"
    assert value(running, runs, task=PROBE, outcome="completed") == 1
    assert value(running, runs, task=PROBE, outcome="failed") == 0
    assert value(running, runs, task=PROBE, outcome="lock_busy") == 0
    assert value(running, "corral_coordinator_task_forced_runs_total", task=PROBE) == 0
    assert value(running, "corral_coordinator_task_wakes_total", task=PROBE) == 1
    assert value(running, "corral_coordinator_task_up", task=PROBE) == 1
    assert value(stopped, "corral_coordinator_task_up", task=PROBE) == 0
    duration = "corral_coordinator_run_duration_seconds"
    assert value(running, f"{duration}_count", task=PROBE) == 1
    assert value(running, f"{duration}_bucket", task=PROBE, le="+Inf") == 1
    assert value(running, "corral_coordinator_targets_total", task=PROBE) == 3
    assert value(running, "corral_coordinator_changed_total", task=PROBE) == 2


async def test_metrics_expose_placement_passes_and_judged_results_reported_to_them(
    world: ApiWorld,
) -> None:
    """What the coordinator reports (a real scheduling pass, judged changes) is exposed."""
    cluster = world.cluster
    placed = [await cluster.submit() for _ in range(2)]
    metrics = CoordinatorMetrics()
    passed = await schedule_group(cluster.db, "default", NOW)
    metrics.observe_placement(passed)
    metrics.observe_results(
        "ScheduleNewSessions",
        [
            StatusChange(placed, "ScheduleNewSessions", SchedulingResult.SUCCESS, frozenset()),
            StatusChange(placed[:1], "ScheduleNewSessions", SchedulingResult.SKIPPED, frozenset()),
        ],
    )
    metrics.observe_result("PromoteToRunning", SchedulingResult.SUCCESS, 4)
    async with client(build_app(context(world), metrics)) as http:
        families = await scrape(http)
    results = "corral_handler_results_total"
    assert value(families, results, handler="ScheduleNewSessions", result="SUCCESS") == 2
    assert value(families, results, handler="ScheduleNewSessions", result="SKIPPED") == 1
    assert value(families, results, handler="PromoteToRunning", result="SUCCESS") == 4
    assert value(families, "corral_placement_pass_duration_seconds_count") == 1
    for stage in ("load", "place", "commit"):
        assert value(families, "corral_placement_stage_duration_seconds_count", stage=stage) == 1


async def test_two_apps_in_one_process_keep_their_own_registries(world: ApiWorld) -> None:
    """Each app scrapes its own figures; building a second app does not clash with the first."""
    async with probe_loop(world) as probe:
        first = build_app(context(world, loops=[probe.loop]))
        second = build_app(context(world, loops=[probe.loop]))
        await probe.start_and_run_once()
        for app in (first, second):
            async with client(app) as http:
                families = await scrape(http)
            duration = "corral_coordinator_run_duration_seconds_count"
            assert value(families, duration, task=PROBE) == 1


async def test_metrics_still_answer_without_the_database(world: ApiWorld) -> None:
    """With the database down the scrape is 200: database_up 0, no session or agent figures."""
    with closed_port() as port:
        unreachable = Database.open(f"postgresql://corral@127.0.0.1:{port}/corral")
        try:
            async with client(build_app(context(world, db=unreachable))) as http:
                families = await scrape(http)
        finally:
            await unreachable.close()
    assert value(families, "corral_database_up") == 0
    assert "corral_sessions" not in families
    assert "corral_agents" not in families


async def test_metrics_and_probes_need_no_token_and_stay_out_of_openapi(
    world: ApiWorld,
) -> None:
    """Scrapers and probes call without a token; none of them is an API route in the schema."""
    async with client(build_app(context(world))) as http:
        metrics = await http.get("/metrics")
        ready = await http.get("/readyz")
        schema = (await http.get("/openapi.json")).json()
    assert metrics.status_code == 200
    assert ready.status_code == 503  # no loops here; not a 401
    assert not {"/metrics", "/healthz", "/readyz"} & set(schema["paths"])
