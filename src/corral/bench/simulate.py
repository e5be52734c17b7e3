"""`corral simulate`: one manager, N simulated agents, M batch sessions through their whole life.

Everything is the real thing except the kernels and the transport: the session controller
submits, the coordinator's dual loops drive every phase, and each agent is the real agent daemon
(registration, heartbeats, long-polled assignments, the progress machine per kernel, batched
reports) with the simulated runtime, talking to the manager's agent controller in-process. It
waits until every session is terminal and checks the invariants on the way and at the end:
no agent over capacity at any moment (the ledger and the agents' own view, sampled), no slot
left occupied, every session terminal, no transition in the history the tables forbid.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.kernel_worker import WorkerSettings
from corral.agent.runtime.simulated import SimulatedRuntime, SimulationProfile
from corral.bench._scratch import scratch_database
from corral.bench.latency import backend_label, percentile
from corral.controller.agents import AgentController, AgentTimings
from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.manager import task_loops
from corral.coordination.orchestrator import Orchestrator
from corral.domain.record import record
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionSpec
from corral.domain.status import (
    KERNEL_TRANSITIONS,
    SESSION_TERMINAL,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import UserId
from corral.manager.backends import open_buses
from corral.manager.inprocess import InProcessManagerClient
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.tables import kernel_history, session_history, sessions, users

JOIN_TOKEN = "simulate"
AGENT_SLOTS = ResourceSlots({"cpu": 8, "mem": "32g"})
KERNEL_RESOURCES = {"cpu": "1", "mem": "1g"}
SUBMIT_BATCH = 1_000
SAMPLE_EVERY_S = 1.0
MAX_REPORTED_VIOLATIONS = 20
# Counting the terminal sessions: every POLL_S, every POLL_NEAR_END_S once at most
# NEAR_END_SHARE of them (or NEAR_END_MIN) are left.
POLL_S = 1.0
POLL_NEAR_END_S = 0.05
NEAR_END_SHARE = 0.05
NEAR_END_MIN = 200


class SimulationError(RuntimeError):
    """The simulation could not finish (its sessions did not all end in time)."""


@record
class SimulationConfig:
    """What to simulate."""

    database: str = "sqlite"
    redis_url: str | None = None
    agents: int = 100
    sessions: int = 1_000
    cluster_size: int = 1
    fail_rate: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0


@dataclass
class _Violations:
    """Invariant violations seen so far (a few kept as examples)."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.count += 1
        if len(self.examples) < MAX_REPORTED_VIOLATIONS:
            self.examples.append(what)


async def run_simulation(
    config: SimulationConfig, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the simulation on a scratch database; the result as JSON-ready data."""
    say = progress or (lambda _message: None)
    prefix = f"sim{uuid.uuid4().hex[:8]}"
    async with (
        scratch_database(config.database) as db,
        open_buses(db, config.redis_url, prefix) as buses,
    ):
        coordinator = SessionCoordinator(db, buses.hints, buses.events)
        controller = AgentController(
            db,
            buses.hints,
            join_token=JOIN_TOKEN,
            timings=AgentTimings(),
            promote=coordinator.promote_reported,
        )
        orchestrator = Orchestrator(
            task_loops(coordinator.tasks(), buses.hints, buses.locks), grace_period_s=5
        )
        sessions_ctl = SessionController(db, buses.hints, buses.events)
        violations = _Violations()
        with tempfile.TemporaryDirectory(prefix="corral-simulate-") as tmp:
            daemons = _agents(config, controller, Path(tmp))
            side = [
                asyncio.create_task(orchestrator.run(), name="sim-orchestrator"),
                asyncio.create_task(controller.polls.run(), name="sim-watcher"),
                *(asyncio.create_task(d.run(), name=f"sim-{d.config.agent_id}") for d in daemons),
            ]
            try:
                await asyncio.gather(*(d.registered.wait() for d in daemons))
                say(f"{len(daemons)} agents registered; submitting {config.sessions} sessions")
                owner = await _add_user(db)
                started = time.perf_counter()
                await _submit(sessions_ctl, owner, config)
                sampler = asyncio.create_task(_sample(db, daemons, violations))
                try:
                    terminal = await _until_terminal(db, config, started, say, side[:2])
                finally:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
                elapsed_s = time.perf_counter() - started
            finally:
                for daemon in daemons:
                    await daemon.stop()
                await orchestrator.stop()
                for task in side[1:]:
                    task.cancel()
                await asyncio.gather(*side, return_exceptions=True)
            await _check_end(db, violations)
            summary = await _summary(db)
    running_ms = summary.pop("submit_to_running_ms")
    return {
        "benchmark": "simulate",
        "backend": backend_label(config.database, config.redis_url),
        "agents": config.agents,
        "sessions": config.sessions,
        "cluster_size": config.cluster_size,
        "fail_rate": config.fail_rate,
        "terminal": terminal,
        "seconds": round(elapsed_s, 3),
        "lifecycle_sessions_per_s": round(config.sessions / elapsed_s, 1),
        "p50_submit_to_running_ms": round(percentile(running_ms, 0.5), 1) if running_ms else None,
        "p99_submit_to_running_ms": round(percentile(running_ms, 0.99), 1) if running_ms else None,
        **summary,
        "reports": sum(d.shipper.sent for d in daemons),
        "invariant_violations": violations.count,
        "violation_examples": violations.examples,
    }


def _agents(config: SimulationConfig, controller: AgentController, tmp: Path) -> list[AgentDaemon]:
    profile = (
        SimulationProfile.with_fail_rate(config.fail_rate)
        if config.fail_rate
        else SimulationProfile()
    )
    # Retries of a failed stage follow at once: simulated faults are not transient waits.
    worker = WorkerSettings(stop_grace_s=0, retry_delay_s=0, ship_logs=False)
    daemons = []
    for index in range(config.agents):
        agent_id = f"sim-{index:04d}"
        rng = random.Random(f"{config.seed}-{agent_id}")
        daemons.append(
            AgentDaemon(
                AgentConfig(
                    agent_id=agent_id,
                    token=JOIN_TOKEN,
                    address=f"10.{index // 250}.{index % 250}.1",
                    slots=AGENT_SLOTS,
                    data_dir=tmp / agent_id,
                    worker=worker,
                ),
                InProcessManagerClient(controller),
                SimulatedRuntime(profile, rng=rng, host=agent_id),
                rng=rng,
            )
        )
    return daemons


async def _add_user(db: Database) -> UserId:
    owner = UserId(uuid.uuid4())
    async with db.transaction() as conn:
        await conn.execute(
            users.insert(),
            [{"id": owner, "name": "simulate", "role": "user", "created_at": datetime.now(UTC)}],
        )
    return owner


async def _submit(controller: SessionController, owner: UserId, config: SimulationConfig) -> None:
    spec = SessionSpec.model_validate(
        {
            "image": "python",
            "command": ["simulated"],
            "resources": KERNEL_RESOURCES,
            "cluster_size": config.cluster_size,
            "cluster_mode": "multi-node" if config.cluster_size > 1 else "single-node",
        }
    )
    for start in range(0, config.sessions, SUBMIT_BATCH):
        count = min(SUBMIT_BATCH, config.sessions - start)
        await controller.enqueue_many([spec] * count, owner)


async def _until_terminal(
    db: Database,
    config: SimulationConfig,
    started: float,
    say: Callable[[str], None],
    services: Sequence[asyncio.Task[None]] = (),
) -> int:
    """The number of terminal sessions, once all are; SimulationError at the timeout, or as
    soon as one of the manager's `services` (its loops, its poll server) has stopped."""
    terminal_values = [s.value for s in SESSION_TERMINAL]
    deadline = started + config.timeout_s
    last_said = 0.0
    while True:
        for service in services:
            if service.done():
                error = None if service.cancelled() else service.exception()
                raise SimulationError(
                    f"the manager's {service.get_name()} stopped"
                    + (f": {type(error).__name__}: {error}" if error else "")
                    + "; the sessions cannot end"
                )
        async with db.read() as conn:
            done = int(
                await conn.scalar(
                    sa.select(sa.func.count()).where(sessions.c.status.in_(terminal_values))
                )
                or 0
            )
        now = time.perf_counter()
        if done >= config.sessions:
            return done
        if now > deadline:
            raise SimulationError(
                f"only {done} of {config.sessions} sessions ended within {config.timeout_s} s"
            )
        if now - last_said >= 5:
            say(f"{done}/{config.sessions} sessions ended after {now - started:.1f} s")
            last_said = now
        await asyncio.sleep(_poll_interval_s(config.sessions - done, config.sessions))


def _poll_interval_s(remaining: int, total: int) -> float:
    """How long to wait before counting again: often near the end, which times the run, else
    seldom. Counting is a scan of the sessions (11 ms on PostgreSQL at 20,000): ten a second
    took 2-3 s of a run's PostgreSQL time from the manager it measures."""
    return POLL_NEAR_END_S if remaining <= max(NEAR_END_MIN, total * NEAR_END_SHARE) else POLL_S


async def _sample(db: Database, daemons: list[AgentDaemon], violations: _Violations) -> None:
    """Check capacity every sample: in the ledger, and as each agent itself holds kernels."""
    capacity = AGENT_SLOTS.to_milli()
    while True:
        for agent_id, slots in (await read_ledger(db)).items():
            for slot, (cap, occupied) in slots.items():
                if not 0 <= occupied <= cap:
                    violations.add(f"ledger {agent_id} {slot}: {occupied} of {cap}")
        for daemon in daemons:
            held: Counter[str] = Counter()
            for worker in daemon.workers.values():
                if not worker.done:
                    held.update(worker.launch.slots)
            for slot, amount in held.items():
                if amount > capacity.get(slot, 0):
                    violations.add(
                        f"agent {daemon.config.agent_id} runs {amount} of {slot} "
                        f"(capacity {capacity.get(slot, 0)})"
                    )
        await asyncio.sleep(SAMPLE_EVERY_S)


async def _check_end(db: Database, violations: _Violations) -> None:
    """Nothing occupied, nothing running, no forbidden move in any history."""
    for agent_id, slots in (await read_ledger(db)).items():
        for slot, (_, occupied) in slots.items():
            if occupied:
                violations.add(f"slot leaked: {agent_id} {slot} still holds {occupied}")
    async with db.read() as conn:
        non_terminal = await conn.scalar(
            sa.select(sa.func.count()).where(
                sessions.c.status.not_in([s.value for s in SESSION_TERMINAL])
            )
        )
        if non_terminal:
            violations.add(f"{non_terminal} sessions not terminal")
        for table, transitions, enum in (
            (session_history, SESSION_TRANSITIONS, SessionStatus),
            (kernel_history, KERNEL_TRANSITIONS, KernelStatus),
        ):
            rows = await conn.execute(
                sa.select(table.c.from_status, table.c.to_status, sa.func.count()).group_by(
                    table.c.from_status, table.c.to_status
                )
            )
            for before, after, count in rows:
                if before is None or after is None or before == after:
                    continue
                if not transitions.allowed(enum(before), enum(after)):  # type: ignore[arg-type]
                    violations.add(f"{table.name}: {count} x {before} -> {after}")


async def _summary(db: Database) -> dict[str, Any]:
    async with db.read() as conn:
        by_status: dict[Any, Any] = dict(
            (
                await conn.execute(
                    sa.select(sessions.c.status, sa.func.count()).group_by(sessions.c.status)
                )
            ).all()
        )
        causes: dict[Any, Any] = dict(
            (
                await conn.execute(
                    sa.select(sessions.c.failure_cause, sa.func.count())
                    .where(sessions.c.failure_cause.is_not(None))
                    .group_by(sessions.c.failure_cause)
                )
            ).all()
        )
        reached = (
            sa.select(
                session_history.c.session_id, sa.func.min(session_history.c.created_at).label("at")
            )
            .where(session_history.c.to_status == SessionStatus.RUNNING.value)
            .group_by(session_history.c.session_id)
            .subquery()
        )
        rows = await conn.execute(
            sa.select(sessions.c.created_at, reached.c.at).join(
                reached, reached.c.session_id == sessions.c.id
            )
        )
        running_ms = [(at - created).total_seconds() * 1000 for created, at in rows]
    return {
        "by_status": {str(k): int(v) for k, v in by_status.items()},
        "failure_causes": {str(k): int(v) for k, v in causes.items()},
        "submit_to_running_ms": running_ms,
        "mean_submit_to_running_ms": round(statistics.fmean(running_ms), 1) if running_ms else None,
    }


__all__ = ["SimulationConfig", "SimulationError", "run_simulation"]
