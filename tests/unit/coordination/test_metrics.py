"""CoordinatorMetrics: what a loop's runs and the coordinator's reports add up to."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import CollectorRegistry

from corral.coordination.loop import DualLoop
from corral.coordination.metrics import CoordinatorMetrics
from corral.coordination.tasks import Task, TaskRun
from corral.domain.results import SchedulingResult
from corral.domain.types import SessionId
from corral.infra.hints.memory import MemoryHintBus
from corral.infra.locks.memory import MemoryLockManager
from corral.store.status_changes import StatusChange


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value (0 when it was never observed)."""
    return registry.get_sample_value(name, labels) or 0.0


def loop_over(task: Task) -> DualLoop:
    """A loop over `task` that nothing runs: the tests call its task directly."""
    return DualLoop(task, MemoryHintBus(), MemoryLockManager())


async def test_an_instrumented_task_reports_each_completed_run_once() -> None:
    """Instrumenting the same loop twice still counts one observation per run."""

    async def run() -> TaskRun:
        return TaskRun("T", targets=4, changed=1)

    metrics = CoordinatorMetrics()
    loop = loop_over(Task("T", "t", run))
    metrics.instrument([loop])
    metrics.instrument([loop])
    await loop.task.run()
    await loop.task.run()
    registry = metrics.registry
    assert sample(registry, "corral_coordinator_run_duration_seconds_count", task="T") == 2
    assert sample(registry, "corral_coordinator_targets_total", task="T") == 8
    assert sample(registry, "corral_coordinator_changed_total", task="T") == 2


async def test_a_run_that_raises_is_not_observed() -> None:
    """Failures are the loop's to count; the duration histogram holds completed runs only."""

    async def run() -> TaskRun:
        raise RuntimeError("database down")

    metrics = CoordinatorMetrics()
    loop = loop_over(Task("T", "t", run))
    metrics.instrument([loop])
    with pytest.raises(RuntimeError):
        await loop.task.run()
    assert sample(metrics.registry, "corral_coordinator_run_duration_seconds_count", task="T") == 0


def test_judged_changes_count_their_sessions_by_result() -> None:
    """Each change adds its number of sessions under (handler, result); empty ones add nothing."""
    ids = [SessionId(uuid.uuid4()) for _ in range(3)]
    metrics = CoordinatorMetrics()
    metrics.observe_results(
        "StartSessions",
        [
            StatusChange(ids, "StartSessions", SchedulingResult.NEED_RETRY, frozenset()),
            StatusChange(ids[:1], "StartSessions", SchedulingResult.GIVE_UP, frozenset()),
            StatusChange([], "StartSessions", SchedulingResult.EXPIRED, frozenset()),
        ],
    )
    registry = metrics.registry
    name = "corral_handler_results_total"
    assert sample(registry, name, handler="StartSessions", result="NEED_RETRY") == 3
    assert sample(registry, name, handler="StartSessions", result="GIVE_UP") == 1
    assert (
        registry.get_sample_value(name, {"handler": "StartSessions", "result": "EXPIRED"}) is None
    )


def test_metrics_live_in_the_registry_they_are_given() -> None:
    """Two CoordinatorMetrics never share a registry unless told to, so they never clash."""
    first, second = CoordinatorMetrics(), CoordinatorMetrics()
    assert first.registry is not second.registry
    shared = CollectorRegistry()
    assert CoordinatorMetrics(shared).registry is shared


def test_admission_counts_evictions_by_cause_and_gauges_the_deactivated() -> None:
    metrics = CoordinatorMetrics()
    metrics.observe_admission(["WaitForStart", "WaitForStart", "WaitForRecovery"], 2)
    registry = metrics.registry
    assert (
        registry.get_sample_value("corral_session_evictions_total", {"cause": "WaitForStart"}) == 2
    )
    assert registry.get_sample_value("corral_sessions_deactivated") == 2
    metrics.observe_admission([], None)  # no group enables it: the gauge keeps its value
    assert registry.get_sample_value("corral_sessions_deactivated") == 2
