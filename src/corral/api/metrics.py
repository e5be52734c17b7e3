"""`GET /metrics`: the manager in Prometheus text format, from a registry of its own.

Unauthenticated, like most exporters (Prometheus scrapes without a token): it shows counts and
timings only, never a session's name, owner or spec; keep it behind the network's own controls
if even those are private. Not part of the REST API, so not in the OpenAPI document.

What a scrape returns:
- read from the database, in one read transaction bounded to 2 s: sessions, agents and
  deployments' routes by status (one GROUP BY each, each served by an index); the same
  figures from every manager, so aggregate them with `max`, not `sum`. `corral_database_up`
  is 0 when they could not be read;
- the coordinator loops' own counters, read at scrape time (runs by task and outcome, forced
  runs, wakes, attempts, whether each loop runs); counted per process, so `sum` them;
- `CoordinatorMetrics` (run durations, judged results, placement passes, failed health probes
  of replicas), also per process;
- the process (CPU, memory, file descriptors) and the Python version.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from fastapi import APIRouter, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from corral.coordination.loop import DualLoop
from corral.coordination.metrics import CoordinatorMetrics
from corral.domain.status import RouteStatus, SessionStatus
from corral.store.database import Database
from corral.store.tables import agents, routes, sessions

if TYPE_CHECKING:
    from corral.api.app import ApiContext  # app.py includes this router

__all__ = ["metrics_router"]

logger = logging.getLogger(__name__)

DATABASE_TIMEOUT_S = 2.0  # past this the scrape answers without the database's figures
AGENT_STATUSES = ("ALIVE", "LOST", "TERMINATED")  # tables.agents' CHECK constraint

_SESSIONS_BY_STATUS = sa.select(sessions.c.status, sa.func.count()).group_by(sessions.c.status)
_AGENTS_BY_STATUS = sa.select(agents.c.status, sa.func.count()).group_by(agents.c.status)
_ROUTES_BY_STATUS = sa.select(routes.c.status, sa.func.count()).group_by(routes.c.status)


def metrics_router(context: ApiContext, metrics: CoordinatorMetrics | None = None) -> APIRouter:
    """The `/metrics` route of one app, over `context` and its own registry.

    `metrics` is the one the manager's coordinator reports to (a new one when None); its
    registry receives the loop, process and platform collectors, so give each app its own.
    The loops of `context` are instrumented (see `CoordinatorMetrics.instrument`).
    """
    coordinator = metrics if metrics is not None else CoordinatorMetrics()
    coordinator.instrument(context.loops)
    registry = coordinator.registry
    registry.register(_LoopCollector(context.loops))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", include_in_schema=False)
    async def scrape() -> Response:
        """Every metric, in the Prometheus text format."""
        families = await _database_families(context.db)
        body = generate_latest(_Scrape(registry, families))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return router


class _Scrape:
    """A registry's metrics plus the families read from the database for this scrape only."""

    def __init__(self, registry: CollectorRegistry, extra: Sequence[Metric]) -> None:
        self._registry = registry
        self._extra = extra

    def collect(self) -> Iterable[Metric]:
        yield from self._registry.collect()
        yield from self._extra


class _LoopCollector:
    """The dual loops' counters, read when scraped (the loops keep them for free)."""

    def __init__(self, loops: Sequence[DualLoop]) -> None:
        self._loops = loops

    def describe(self) -> Iterable[Metric]:
        return _loop_families(())

    def collect(self) -> Iterable[Metric]:
        return _loop_families(self._loops)


def _loop_families(loops: Sequence[DualLoop]) -> list[Metric]:
    runs = CounterMetricFamily(
        "corral_coordinator_task_runs",
        "Runs of each coordinator task by outcome: completed; failed (the run or taking its "
        "lock raised); lock_busy (another manager held the task's lock and ran it).",
        labels=["task", "outcome"],
    )
    forced = CounterMetricFamily(
        "corral_coordinator_task_forced_runs",
        "Completed runs the long loop forced, whatever the hints said.",
        labels=["task"],
    )
    wakes = CounterMetricFamily(
        "corral_coordinator_task_wakes", "Times a set hint woke the task's loop.", labels=["task"]
    )
    attempts = CounterMetricFamily(
        "corral_coordinator_task_attempts",
        "Times the task's loop decided whether to run (idle ticks included).",
        labels=["task"],
    )
    up = GaugeMetricFamily(
        "corral_coordinator_task_up", "1 while the task's loop runs, else 0.", labels=["task"]
    )
    for loop in loops:
        task = loop.task.name
        runs.add_metric([task, "completed"], loop.runs)
        runs.add_metric([task, "failed"], loop.failures)
        runs.add_metric([task, "lock_busy"], loop.lock_busy)
        forced.add_metric([task], loop.forced_runs)
        wakes.add_metric([task], loop.wakes)
        attempts.add_metric([task], loop.attempts)
        up.add_metric([task], 1 if loop.running else 0)
    return [runs, forced, wakes, attempts, up]


async def _database_families(db: Database) -> list[Metric]:
    """Sessions and agents by status (every status, zeros included), and whether they were read."""
    started = time.perf_counter()
    database_up = GaugeMetricFamily(
        "corral_database_up", "1 when this scrape read the sessions and agents, else 0."
    )
    duration = GaugeMetricFamily(
        "corral_database_scrape_duration_seconds",
        "Time this scrape spent reading the database's figures.",
    )
    families: list[Metric] = [database_up, duration]
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT_S), db.read() as conn:
            by_session_status = {s: n for s, n in await conn.execute(_SESSIONS_BY_STATUS)}
            by_agent_status = {s: n for s, n in await conn.execute(_AGENTS_BY_STATUS)}
            by_route_status = {s: n for s, n in await conn.execute(_ROUTES_BY_STATUS)}
    except Exception as exc:
        # The process's own figures are still worth a scrape; the up gauge says what is missing.
        logger.warning("metrics.database_unavailable", extra={"error": type(exc).__name__})
        database_up.add_metric([], 0)
        duration.add_metric([], time.perf_counter() - started)
        return families
    database_up.add_metric([], 1)
    duration.add_metric([], time.perf_counter() - started)
    session_family = GaugeMetricFamily(
        "corral_sessions",
        "Sessions by status, in the whole database (every manager reports the same).",
        labels=["status"],
    )
    for status in SessionStatus:
        session_family.add_metric([status.value], by_session_status.get(status.value, 0))
    agent_family = GaugeMetricFamily(
        "corral_agents",
        "Agents by status, in the whole database (every manager reports the same).",
        labels=["status"],
    )
    for agent_status in AGENT_STATUSES:
        agent_family.add_metric([agent_status], by_agent_status.get(agent_status, 0))
    route_family = GaugeMetricFamily(
        "corral_routes",
        "Deployments' replicas (routes) by status, in the whole database.",
        labels=["status"],
    )
    for route_status in RouteStatus:
        route_family.add_metric([route_status.value], by_route_status.get(route_status.value, 0))
    families += [session_family, agent_family, route_family]
    return families
