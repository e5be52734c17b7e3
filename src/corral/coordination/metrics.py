"""What the coordinator reports as it works: run durations, judged results, placement passes.

One `CoordinatorMetrics` per manager process, registered in one Prometheus registry (never the
process-wide default, so several managers or apps in one process do not clash). The loops report
through their tasks: `instrument` wraps each loop's task, so `loop.py` knows nothing of metrics.
Judged results and placement passes are reported by whoever owns them (`observe_results`,
`observe_placement`); until a caller is wired, those families are exposed with no samples.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from corral.coordination.loop import DualLoop
from corral.coordination.tasks import Task, TaskRun
from corral.domain.results import SchedulingResult
from corral.domain.retry.decide import RetryDecision
from corral.handlers.sessions.retries import Dispatched
from corral.scheduler.scheduler import PassResult
from corral.store.status_changes import StatusChange

__all__ = ["DURATION_BUCKETS_S", "CoordinatorMetrics"]

# From a run that finds nothing (about a millisecond) to placing 10,000 sessions (seconds).
DURATION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
PLACEMENT_STAGES = ("load", "place", "commit")


class CoordinatorMetrics:
    """Histograms and counters of the coordinator's work, in `registry` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.run_duration = Histogram(
            "corral_coordinator_run_duration_seconds",
            "Wall time of one completed coordinator task run (runs that found nothing included).",
            ["task"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.targets = Counter(
            "corral_coordinator_targets",
            "Entities the task's completed runs looked at.",
            ["task"],
            registry=self.registry,
        )
        self.changed = Counter(
            "corral_coordinator_changed",
            "Entities whose status the task's completed runs changed.",
            ["task"],
            registry=self.registry,
        )
        self.results = Counter(
            "corral_handler_results",
            "Sessions judged per handler and result (SUCCESS, NEED_RETRY, EXPIRED, GIVE_UP, "
            "SKIPPED), counted by this process.",
            ["handler", "result"],
            registry=self.registry,
        )
        self.placement_pass = Histogram(
            "corral_placement_pass_duration_seconds",
            "Wall time of one scheduling pass over a resource group: load, place and commit.",
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.placement_stage = Histogram(
            "corral_placement_stage_duration_seconds",
            "Wall time of one stage of a scheduling pass: load (snapshot), place, commit.",
            ["stage"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        # Session retry (spec document 5), counted by the manager that decided.
        self.retry_scheduled = Counter(
            "corral_session_retry_scheduled",
            "Retries of failed sessions created, by the failure's retry cause.",
            ["cause"],
            registry=self.registry,
        )
        self.retry_exhausted = Counter(
            "corral_session_retry_exhausted",
            "Sessions that failed with no retries left, by the failure's retry cause.",
            ["cause"],
            registry=self.registry,
        )
        self.retry_succeeded = Counter(
            "corral_session_retry_succeeded",
            "Retries that ended successfully (the chains that recovered).",
            registry=self.registry,
        )
        # All-or-nothing admission (spec document 2), counted by the manager that evicted.
        self.evictions = Counter(
            "corral_session_evictions",
            "Sessions evicted for not having every kernel ready in time, by cause "
            "(WaitForStart, WaitForRecovery).",
            ["cause"],
            registry=self.registry,
        )
        self.deactivated = Gauge(
            "corral_sessions_deactivated",
            "Sessions deactivated after too many requeues, as the last admission run saw them.",
            registry=self.registry,
        )
        # Serving (issue 38): replicas' health probes that failed, counted by the prober.
        self.probe_failures = Counter(
            "corral_route_probe_failures",
            "Health probes of deployments' replicas that failed (refused, timed out, or "
            "answered another status than expected), counted by the manager that probed.",
            registry=self.registry,
        )
        # Loops whose task already reports here: instrumenting twice would count runs twice.
        self._instrumented: weakref.WeakSet[DualLoop] = weakref.WeakSet()

    def observe_retries(self, done: Dispatched) -> None:
        """Count what one run of the retry task decided."""
        for _, verdict in done.decided:
            cause = verdict.cause.value if verdict.cause is not None else "none"
            if verdict.decision is RetryDecision.SCHEDULED:
                self.retry_scheduled.labels(cause).inc()
            elif verdict.decision is RetryDecision.EXHAUSTED:
                self.retry_exhausted.labels(cause).inc()
        if done.recovered:
            self.retry_succeeded.inc(done.recovered)

    def observe_admission(self, causes: Iterable[str], deactivated: int | None) -> None:
        """Count one admission run's evictions (by cause) and set the deactivated gauge (None:
        no group enables admission, nothing was read)."""
        for cause in causes:
            self.evictions.labels(cause).inc()
        if deactivated is not None:
            self.deactivated.set(deactivated)

    def observe_probe_failures(self, failed: int) -> None:
        """Count one health-check run's failed probes."""
        if failed:
            self.probe_failures.inc(failed)

    def instrument(self, loops: Iterable[DualLoop]) -> None:
        """Make every run of these loops' tasks report here; a loop done already is left as is."""
        for loop in loops:
            if loop in self._instrumented:
                continue
            loop.task = self.timed(loop.task)
            self._instrumented.add(loop)

    def timed(self, task: Task) -> Task:
        """`task` whose every completed run is observed (a run that raises is not)."""
        inner = task.run

        async def run() -> TaskRun:
            started = time.perf_counter()
            result = await inner()
            self.observe_run(task.name, time.perf_counter() - started, result)
            return result

        return replace(task, run=run)

    def observe_run(self, task: str, duration_s: float, run: TaskRun) -> None:
        """One completed run of `task` that took `duration_s`."""
        self.run_duration.labels(task).observe(duration_s)
        self.targets.labels(task).inc(run.targets)
        self.changed.labels(task).inc(run.changed)

    def observe_results(self, handler: str, changes: Iterable[StatusChange]) -> None:
        """The judged changes of one lifecycle run (one count per session and change)."""
        for change in changes:
            self.observe_result(handler, change.result, len(change.session_ids))

    def observe_result(self, handler: str, result: SchedulingResult, sessions: int) -> None:
        """`sessions` judged `result` by `handler` (promotions report their SUCCESS moves)."""
        if sessions:
            self.results.labels(handler, result.value).inc(sessions)

    def observe_placement(self, passed: PassResult) -> None:
        """One scheduling pass, with the time of each of its stages."""
        stages_ms = (passed.load_ms, passed.placement_ms, passed.commit_ms)
        self.placement_pass.observe(sum(stages_ms) / 1000)
        for stage, ms in zip(PLACEMENT_STAGES, stages_ms, strict=True):
            self.placement_stage.labels(stage).observe(ms / 1000)
