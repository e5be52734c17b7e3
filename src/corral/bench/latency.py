"""`corral bench latency`: submit → RUNNING at a steady rate, one manager, instant test agents.

The manager is what `corral` runs: the session controller for submissions, the session
coordinator's dual loops with their default intervals (so every phase is woken by a hint, not a
tick), and test agents that answer their assignments at once. Latency is what a user watching
the event stream sees: from just before `enqueue` to the arrival of the session's
`session.status_changed` event to RUNNING. Kernels keep running, so nothing ever queues for
capacity and every session stays on its agent until the scratch database is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from redis.asyncio import Redis

from corral.bench._scratch import scratch_database
from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.hints import Hint
from corral.coordination.manager import session_orchestrator
from corral.coordination.orchestrator import Orchestrator
from corral.coordination.tasks import Task, TaskRun
from corral.domain.events import DROPPED_KIND
from corral.domain.record import record
from corral.domain.spec import SessionSpec
from corral.domain.status import SessionStatus
from corral.domain.types import AgentId, UserId
from corral.infra.events import Subscription
from corral.infra.hints import HintBus
from corral.manager.backends import Buses, open_buses
from corral.store.agents import NewAgent, insert_agents
from corral.store.database import Database
from corral.store.events import SESSION_STATUS_CHANGED
from corral.store.tables import users
from corral.testing.agent import TestAgent

GIB_MILLI = 1024**3 * 1000
AGENT_CPU_MILLI = 64_000
AGENT_MEM_MILLI = 256 * GIB_MILLI
WARMUP_SESSIONS = 5
# Beyond the coordinator's 60 s long loop: a lost hint shows as an outlier, not as a failure.
DEFAULT_TIMEOUT_S = 75.0
# How often the test agents reconcile when no hint wakes them (TestAgent.run's default).
AGENT_INTERVAL_S = 1.0
# The order a session moves in on its way to RUNNING; each hop is reported on its own.
_PATH = (
    SessionStatus.PENDING,
    SessionStatus.SCHEDULED,
    SessionStatus.PREPARING,
    SessionStatus.PREPARED,
    SessionStatus.CREATING,
    SessionStatus.RUNNING,
)
_SPEC = SessionSpec.model_validate(
    {"image": "python", "command": ["true"], "resources": {"cpu": "1", "mem": "1g"}}
)


class LatencyBenchError(RuntimeError):
    """The bench could not measure: events were lost on the way to the subscriber."""


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q ≤ 1) of `values`; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _summary(values: Sequence[float]) -> dict[str, float | int]:
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.5), 1),
        "p99_ms": round(percentile(values, 0.99), 1),
        "max_ms": round(max(values, default=math.nan), 1),
    }


@record
class TimedRun:
    """One run of a coordinator task, as the bench saw it (perf_counter seconds)."""

    hinted: float | None  # when its hint was first set since the previous run (None: unhinted)
    started: float
    ended: float
    run: TaskRun


@dataclass(slots=True)
class _Recorder:
    """Arrival times of every session's statuses, task runs and agent steps."""

    # session id (text) → status → perf_counter when its event (or its submission) was seen
    seen: defaultdict[str, dict[SessionStatus, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    submit_ms: list[float] = field(default_factory=list)
    runs: defaultdict[str, list[TimedRun]] = field(default_factory=lambda: defaultdict(list))
    agent_steps_ms: list[float] = field(default_factory=list)
    dropped: int = 0
    running: set[str] = field(default_factory=set)
    target: int = 0  # sessions that must reach RUNNING before `all_running` is set
    all_running: asyncio.Event = field(default_factory=asyncio.Event)
    hint_set_at: dict[str, float] = field(default_factory=dict)  # hint → first set, unconsumed

    def arrived(self, session_id: str, status: SessionStatus, at: float) -> None:
        self.seen[session_id].setdefault(status, at)
        if status is SessionStatus.RUNNING:
            self.running.add(session_id)
            if len(self.running) >= self.target:
                self.all_running.set()

    def expect(self, target: int) -> None:
        """Forget everything seen so far; wait for `target` new sessions to reach RUNNING."""
        self.seen.clear()
        self.submit_ms.clear()
        self.runs.clear()
        self.agent_steps_ms.clear()
        self.hint_set_at.clear()
        self.running.clear()
        self.target = target
        self.all_running.clear()

    def timed(self, task: Task) -> Task:
        """`task` whose every run is recorded."""
        inner = task.run

        async def run() -> TaskRun:
            started = time.perf_counter()
            # The loop consumed the hint just before calling run(): the set it answers is over.
            hinted = self.hint_set_at.pop(task.hint, None)
            result = await inner()
            self.runs[task.name].append(TimedRun(hinted, started, time.perf_counter(), result))
            return result

        return replace(task, run=run)


class _TimedHints(HintBus):
    """A hint bus that notes when each hint is set, to time a loop's wake-up."""

    def __init__(self, inner: HintBus, recorder: _Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    async def set(self, *names: str) -> None:
        now = time.perf_counter()
        for name in names:
            self._recorder.hint_set_at.setdefault(name, now)
        await self._inner.set(*names)

    async def consume(self, name: str) -> bool:
        return await self._inner.consume(name)

    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        return await self._inner.wait(names, timeout_s)

    def claim(self, name: str) -> None:
        self._inner.claim(name)

    async def release(self, name: str) -> None:
        await self._inner.release(name)

    async def close(self) -> None:
        await self._inner.close()


@record
class LatencyBenchResult:
    """Figures of one run on one backend."""

    backend: str
    agents: int
    rate_per_s: float
    sessions: int
    submit_s: float  # first submission to last submission
    elapsed_s: float  # first submission to the last RUNNING event
    latency_ms: list[float]  # submit → RUNNING of every session that got there
    submit_ms: list[float]  # the enqueue call alone
    hops_ms: dict[str, list[float]]  # per hop of _PATH
    runs: dict[str, list[TimedRun]]  # per coordinator task, runs that found targets
    agent_steps_ms: list[float]

    def as_json(self) -> dict[str, object]:
        return {
            "benchmark": "latency",
            "backend": self.backend,
            "sessions": self.sessions,
            "running": len(self.latency_ms),
            "agents": self.agents,
            "rate_per_s": self.rate_per_s,
            "achieved_rate_per_s": round((self.sessions - 1) / self.submit_s, 1)
            if self.submit_s > 0
            else None,
            "elapsed_s": round(self.elapsed_s, 3),
            "p50_ms": round(percentile(self.latency_ms, 0.5), 1),
            "p90_ms": round(percentile(self.latency_ms, 0.9), 1),
            "p99_ms": round(percentile(self.latency_ms, 0.99), 1),
            "max_ms": round(max(self.latency_ms, default=math.nan), 1),
            "mean_ms": round(sum(self.latency_ms) / len(self.latency_ms), 1)
            if self.latency_ms
            else None,
            "enqueue_ms": _summary(self.submit_ms),
            "hops_ms": {hop: _summary(values) for hop, values in self.hops_ms.items()},
            "task_runs": {
                name: {
                    **_summary([(r.ended - r.started) * 1000 for r in runs]),
                    "mean_changed": round(sum(r.run.changed for r in runs) / len(runs), 1),
                    "wake_ms": _summary(
                        [(r.started - r.hinted) * 1000 for r in runs if r.hinted is not None]
                    ),
                }
                for name, runs in self.runs.items()
                if runs
            },
            "agent_steps_ms": _summary(self.agent_steps_ms),
        }


def backend_label(database: str, redis_url: str | None) -> str:
    """`sqlite` or `postgresql`, with `+redis` when Redis carries hints, locks and events."""
    dialect = "sqlite" if database == "sqlite" or database.startswith("sqlite") else "postgresql"
    return f"{dialect}+redis" if redis_url else dialect


@asynccontextmanager
async def _open_buses(db: Database, redis_url: str | None, prefix: str) -> AsyncIterator[Buses]:
    """The manager's buses; with Redis, the hint keys the run left set are deleted after it."""
    async with open_buses(db, redis_url, prefix) as buses:
        try:
            yield buses
        finally:
            if redis_url:
                await _forget_hints(redis_url, prefix)


async def _forget_hints(redis_url: str, prefix: str) -> None:
    """Delete the hint keys the run left set (see infra/hints/redis.py for the key names)."""
    client = Redis.from_url(redis_url)
    try:
        await client.delete(*[f"{prefix}:hint:{hint.value}" for hint in Hint])
    finally:
        await client.aclose()


async def _add_cluster(db: Database, agents: int) -> tuple[UserId, list[AgentId]]:
    now = datetime.now(UTC)
    owner = UserId(uuid.uuid4())
    async with db.transaction() as conn:
        await conn.execute(
            users.insert(), [{"id": owner, "name": "bench", "role": "user", "created_at": now}]
        )
    new = [
        NewAgent(
            AgentId(f"bench-{i:04d}"),
            f"10.0.{i // 250}.{i % 250}:6001",
            {"cpu": AGENT_CPU_MILLI, "mem": AGENT_MEM_MILLI},
        )
        for i in range(agents)
    ]
    await insert_agents(db, new, now)
    return owner, [a.id for a in new]


async def _collect(subscription: Subscription, recorder: _Recorder) -> None:
    """Record when each session's status event arrives; count gaps the bus reports."""
    async for event in subscription:
        at = time.perf_counter()
        if event.kind == DROPPED_KIND:
            recorder.dropped += 1
        elif event.kind == SESSION_STATUS_CHANGED:
            to = SessionStatus(event.payload["to"])
            recorder.arrived(event.entity_id, to, at)


async def _submit_all(
    controller: SessionController,
    owner: UserId,
    recorder: _Recorder,
    count: int,
    rate_per_s: float,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[str], float]:
    """Submit `count` sessions, each at its slot of a steady schedule, each in its own task.

    Open loop: a slow submission does not delay the next one, as with independent users.
    Returns the session ids and the time from the first to the last submission.
    """
    ids: list[str] = []

    async def submit() -> None:
        started = time.perf_counter()
        submitted = await controller.enqueue(_SPEC, owner)
        recorder.submit_ms.append((time.perf_counter() - started) * 1000)
        sid = str(submitted.session_id)
        recorder.seen[sid][SessionStatus.PENDING] = started
        ids.append(sid)

    tasks: list[asyncio.Task[None]] = []
    first = time.perf_counter()
    for i in range(count):
        delay_s = first + i / rate_per_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.create_task(submit(), name=f"bench-submit-{i}"))
        if progress is not None:
            progress(i + 1)
    last = time.perf_counter()
    await asyncio.gather(*tasks)
    return ids, last - first


async def run_latency_bench(
    database: str,
    *,
    redis_url: str | None = None,
    sessions: int,
    rate_per_s: float = 100.0,
    agents: int = 50,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> LatencyBenchResult:
    """Submit `sessions` at `rate_per_s` to one manager with instant agents; time each to RUNNING.

    A few warm-up sessions go first (connections, statement caches) and are not counted.
    Waits at most `timeout_s` after the last submission; sessions not RUNNING by then are
    missing from the latencies.
    """
    recorder = _Recorder()
    prefix = f"corral-bench-{uuid.uuid4().hex[:8]}"
    async with scratch_database(database) as db, _open_buses(db, redis_url, prefix) as buses:
        owner, agent_ids = await _add_cluster(db, agents)
        hints = _TimedHints(buses.hints, recorder)
        controller = SessionController(db, hints, buses.events)
        coordinator = SessionCoordinator(db, hints, buses.events, lock_prefix=prefix)
        orchestrator = session_orchestrator(coordinator, hints, buses.locks)
        for loop in orchestrator.loops:
            loop.task = recorder.timed(loop.task)
        agent = TestAgent(db, agent_ids, hints=hints, promote=coordinator.promote_reported)

        def stepped(reports: int, elapsed_ms: float) -> None:
            if reports:
                recorder.agent_steps_ms.append(elapsed_ms)

        maxsize = (sessions + WARMUP_SESSIONS) * len(_PATH) + 1000

        def submitted(n: int) -> None:
            if progress is not None and n % max(1, round(rate_per_s)) == 0:
                progress(f"submitted {n}/{sessions}, {len(recorder.running)} RUNNING")

        async with buses.events.subscribe(maxsize=maxsize) as subscription:
            side = [
                asyncio.create_task(_collect(subscription, recorder), name="bench-collect"),
                asyncio.create_task(orchestrator.run(), name="bench-orchestrator"),
                asyncio.create_task(
                    agent.run(asyncio.Event(), interval_s=AGENT_INTERVAL_S, on_step=stepped),
                    name="bench-agents",
                ),
            ]
            try:
                recorder.expect(WARMUP_SESSIONS)
                await _submit_all(controller, owner, recorder, WARMUP_SESSIONS, 1000.0)
                if not await _until_running(recorder, side, timeout_s):
                    raise LatencyBenchError(
                        f"the warm-up sessions did not reach RUNNING within {timeout_s:g} s"
                    )
                if progress is not None:
                    progress(f"warm-up done; submitting {sessions} sessions at {rate_per_s:g}/s")
                recorder.expect(sessions)
                ids, submit_s = await _submit_all(
                    controller, owner, recorder, sessions, rate_per_s, submitted
                )
                await _until_running(recorder, side, timeout_s)
            finally:
                await _stop(orchestrator, side)
        elapsed_s = (
            max(recorder.seen[sid][SessionStatus.RUNNING] for sid in recorder.running)
            - min(recorder.seen[sid][SessionStatus.PENDING] for sid in ids)
            if recorder.running
            else math.nan
        )
        if recorder.dropped:
            raise LatencyBenchError(
                f"the event bus reported {recorder.dropped} gap(s) in the stream, so some "
                "latencies are unknown; rerun, or lower --rate"
            )
    return LatencyBenchResult(
        backend=backend_label(database, redis_url),
        agents=agents,
        rate_per_s=rate_per_s,
        sessions=sessions,
        submit_s=submit_s,
        elapsed_s=elapsed_s,
        latency_ms=[_ms(recorder.seen[sid], SessionStatus.RUNNING) for sid in recorder.running],
        submit_ms=list(recorder.submit_ms),
        hops_ms=_hops(recorder.seen),
        runs={name: [r for r in runs if r.run.targets] for name, runs in recorder.runs.items()},
        agent_steps_ms=list(recorder.agent_steps_ms),
    )


def _ms(seen: dict[SessionStatus, float], status: SessionStatus) -> float:
    """Milliseconds from submission to `status`."""
    return (seen[status] - seen[SessionStatus.PENDING]) * 1000


def _hops(seen: dict[str, dict[SessionStatus, float]]) -> dict[str, list[float]]:
    """Per step of the path to RUNNING, the milliseconds each session spent on it."""
    hops: dict[str, list[float]] = {f"{a}->{b}": [] for a, b in itertools.pairwise(_PATH)}
    for statuses in seen.values():
        for a, b in itertools.pairwise(_PATH):
            if a in statuses and b in statuses:
                hops[f"{a}->{b}"].append((statuses[b] - statuses[a]) * 1000)
    return hops


async def _until_running(
    recorder: _Recorder, side: Sequence[asyncio.Task[None]], timeout_s: float
) -> bool:
    """Whether every expected session reached RUNNING within `timeout_s`.

    The side tasks run until cancelled: one that ends first stops the bench with its error.
    """
    waiting = asyncio.create_task(recorder.all_running.wait(), name="bench-wait")
    try:
        await asyncio.wait([waiting, *side], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    for task in side:
        if task.done():
            task.result()
            raise LatencyBenchError(f"{task.get_name()} ended in the middle of the bench")
    return recorder.all_running.is_set()


async def _stop(orchestrator: Orchestrator, side: Sequence[asyncio.Task[None]]) -> None:
    """Stop the manager (its own grace period), then the agents and the collector."""
    await orchestrator.stop()
    for task in side:
        task.cancel()
    for outcome in await asyncio.gather(*side, return_exceptions=True):
        if isinstance(outcome, Exception):
            raise outcome
