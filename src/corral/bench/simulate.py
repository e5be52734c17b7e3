"""`corral simulate`: one manager, N simulated agents, M batch sessions through their whole life.

Everything is the real thing except the kernels and the transport: the session controller
submits, the coordinator's dual loops drive every phase, and each agent is the real agent daemon
(registration, heartbeats, long-polled assignments, the progress machine per kernel, batched
reports) with the simulated runtime. The agents run in a process of their own, as agents on other
nodes would, and speak the protocol's messages to the manager's agent controller over a socket
pair (`agent_pipe.py`, `agent_host.py`). It waits until every session is terminal and checks the
invariants on the way and at the end: no agent over capacity at any moment (the ledger here, the
agents' own view in their process, sampled), no slot left occupied, every session terminal, no
transition in the history the tables forbid.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.bench._scratch import scratch_database
from corral.bench.agent_host import JOIN_TOKEN, SAMPLE_EVERY_S, HostConfig, Violations
from corral.bench.agent_pipe import AgentPipeServer
from corral.bench.dashboard_load import DashboardCounts, open_dashboards
from corral.bench.latency import backend_label, percentile
from corral.client.uploads import pack_directory
from corral.controller.agents import AgentController, AgentTimings
from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.manager import task_loops
from corral.coordination.orchestrator import Orchestrator
from corral.domain.record import record
from corral.domain.spec import SessionSpec
from corral.domain.status import (
    KERNEL_TRANSITIONS,
    SESSION_TERMINAL,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import UserId, utcnow
from corral.manager.backends import open_buses
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.resource_group_store import DEFAULT_GROUP, update_group
from corral.store.tables import (
    RETRY_UNDECIDED,
    kernel_history,
    session_history,
    sessions,
    users,
)
from corral.store.uploads import store_upload

KERNEL_RESOURCES = {"cpu": "1", "mem": "1g"}
SUBMIT_BATCH = 1_000
STOP_WAIT_S = 30.0  # for the agents' process to stop its agents and exit
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
    # A directory every session names as its upload: each kernel fetches it over the agents'
    # pipe and unpacks it, as `corral run --upload` has agents do.
    upload: Path | None = None
    # A retry policy on every session (0: none): failed sessions are retried this many times
    # at most, after `retry_delay_s`; the run ends when every chain has ended.
    retries: int = 0
    retry_delay_s: float = 0.0
    # All-or-nothing admission (spec document 2) on the default group, without blocking.
    wait_for_kernels_ready: bool = False
    # Dashboards kept open on the manager while it runs the sessions (`dashboard_load`).
    dashboards: int = 0


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
        violations = Violations()
        boards = DashboardCounts(config.dashboards)
        side = [
            asyncio.create_task(orchestrator.run(), name="sim-orchestrator"),
            asyncio.create_task(controller.polls.run(), name="sim-watcher"),
        ]
        agents = AgentsProcess(controller)
        try:
            await agents.start(config)
            say(f"{config.agents} agents registered; submitting {config.sessions} sessions")
            owner = await _add_user(db)
            if config.wait_for_kernels_ready:
                await update_group(
                    db,
                    DEFAULT_GROUP,
                    utcnow(),
                    options_patch={"wait_for_kernels_ready": {"enable": True}},
                )
            digest = await _store_upload(db, owner, config.upload)
            async with contextlib.AsyncExitStack() as open_pages:
                if config.dashboards:
                    await open_pages.enter_async_context(
                        open_dashboards(
                            db, controller, sessions_ctl, buses.events, config.dashboards, boards
                        )
                    )
                    say(f"{config.dashboards} dashboards open")
                started = time.perf_counter()
                await _submit(sessions_ctl, owner, config, digest)
                sampler = asyncio.create_task(_sample(db, violations))
                try:
                    terminal = await _until_terminal(
                        db, config, started, say, [*side, agents.watcher]
                    )
                finally:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
                elapsed_s = time.perf_counter() - started
        finally:
            done = await agents.stop()
            await orchestrator.stop()
            for task in side[1:]:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        violations.add_seen(int(done.get("violations", 0)), done.get("examples", []))
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
        "retries": config.retries,
        "wait_for_kernels_ready": config.wait_for_kernels_ready,
        **boards.as_json(),
        "reports": int(done.get("reports", 0)),
        "invariant_violations": violations.count,
        "violation_examples": violations.examples,
    }


class AgentsProcess:
    """The simulated agents' process (`agent_host.py`) and the manager's end of its pipe."""

    def __init__(self, controller: AgentController) -> None:
        self._registered = asyncio.Event()
        self._done: dict[str, Any] = {}
        self._stopping = False
        self._server = AgentPipeServer(controller, self._event)
        self._process: asyncio.subprocess.Process | None = None
        self.watcher = asyncio.create_task(self._watch(), name="sim-agents")

    async def start(self, config: SimulationConfig) -> None:
        """Start the process; return once all its agents are registered."""
        host_config = HostConfig(agents=config.agents, fail_rate=config.fail_rate, seed=config.seed)
        ours, theirs = socket.socketpair()
        try:
            with theirs:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "corral.bench.agent_host",
                    str(theirs.fileno()),
                    host_config.model_dump_json(),
                    pass_fds=[theirs.fileno()],
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                )
            await asyncio.get_running_loop().create_unix_connection(
                lambda: self._server.connection, sock=ours
            )
        except BaseException:
            ours.close()
            raise
        registered = asyncio.create_task(self._registered.wait())
        await asyncio.wait(
            [registered, self.watcher],
            timeout=config.timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        registered.cancel()
        if not self._registered.is_set():
            raise SimulationError(f"the simulated agents did not register: {await self._ending()}")

    async def stop(self) -> dict[str, Any]:
        """Stop the agents as SIGTERM would; what they counted (reports, violations)."""
        self._stopping = True
        if self._server.connection.is_open:
            self._server.send_control("stop")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._server.connection.closed), STOP_WAIT_S)
        await self._server.close()
        self.watcher.cancel()
        await asyncio.gather(self.watcher, return_exceptions=True)
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._process.wait(), STOP_WAIT_S)
            if self._process.returncode is None:
                self._process.kill()
                await self._process.wait()
        return self._done

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        """The agents' process, once started."""
        return self._process

    def _event(self, header: dict[str, Any]) -> None:
        if header["event"] == "registered":
            self._registered.set()
        elif header["event"] == "done":
            self._done = header

    async def _watch(self) -> None:
        await self._server.connection.closed
        if not self._stopping:
            raise RuntimeError(await self._ending())

    async def _ending(self) -> str:
        """How the agents' process ended (or that it is still running)."""
        if self._process is None:
            return "their process did not start"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._process.wait(), STOP_WAIT_S)
        code = self._process.returncode
        return (
            "their process is still running"
            if code is None
            else f"their process exited with code {code}"
        )


async def _add_user(db: Database) -> UserId:
    owner = UserId(uuid.uuid4())
    async with db.transaction() as conn:
        await conn.execute(
            users.insert(),
            [{"id": owner, "name": "simulate", "role": "user", "created_at": datetime.now(UTC)}],
        )
    return owner


async def _store_upload(db: Database, owner: UserId, directory: Path | None) -> str | None:
    """Pack `directory` and store it as the owner's upload (as `PUT /v1/uploads` does); its
    digest (None: no directory)."""
    if directory is None:
        return None
    packed = await asyncio.to_thread(pack_directory, directory)
    try:
        data = packed.archive.read()
    finally:
        packed.close()
    await store_upload(db, owner, packed.digest, data, datetime.now(UTC))
    return packed.digest


async def _submit(
    controller: SessionController,
    owner: UserId,
    config: SimulationConfig,
    upload: str | None = None,
) -> None:
    fields: dict[str, Any] = {
        "image": "python",
        "command": ["simulated"],
        "resources": KERNEL_RESOURCES,
        "cluster_size": config.cluster_size,
        "cluster_mode": "multi-node" if config.cluster_size > 1 else "single-node",
        "upload": upload,
    }
    if config.retries:
        fields["retry_policy"] = {
            "max_retries": config.retries,
            "retry_delay": config.retry_delay_s,
        }
    spec = SessionSpec.model_validate(fields)
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
    """The number of terminal sessions, once all are and no retry is left to decide (every
    retry chain has ended); SimulationError at the timeout, or as soon as one of the
    `services` (the manager's loops, its poll server, the agents) has stopped."""
    terminal_values = [s.value for s in SESSION_TERMINAL]
    ended = sessions.c.status.in_(terminal_values)
    undecided = sa.and_(ended, sa.text(RETRY_UNDECIDED))
    counts = sa.select(
        sa.func.count(),
        sa.func.count().filter(ended),
        sa.func.count().filter(undecided),
    ).select_from(sessions)
    deadline = started + config.timeout_s
    last_said = 0.0
    while True:
        for service in services:
            if service.done():
                error = None if service.cancelled() else service.exception()
                raise SimulationError(
                    f"{service.get_name()} stopped"
                    + (f": {type(error).__name__}: {error}" if error else "")
                    + "; the sessions cannot end"
                )
        async with db.read() as conn:
            total, done, deciding = (await conn.execute(counts)).one()
        now = time.perf_counter()
        if done >= config.sessions and done == total and not deciding:
            return int(done)
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


async def _sample(db: Database, violations: Violations) -> None:
    """Check the ledger every sample: no agent's slot occupied past its capacity."""
    while True:
        for agent_id, slots in (await read_ledger(db)).items():
            for slot, (cap, occupied) in slots.items():
                if not 0 <= occupied <= cap:
                    violations.add(f"ledger {agent_id} {slot}: {occupied} of {cap}")
        await asyncio.sleep(SAMPLE_EVERY_S)


async def _check_end(db: Database, violations: Violations) -> None:
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
        twice = await conn.scalar(
            sa.select(sa.func.count()).select_from(
                sa.select(sessions.c.parent_session_id)
                .where(sessions.c.parent_session_id.is_not(None))
                .group_by(sessions.c.parent_session_id)
                .having(sa.func.count() > 1)
                .subquery()
            )
        )
        if twice:
            violations.add(f"{twice} sessions were retried twice (a duplicate child)")
        undecided = await conn.scalar(
            sa.select(sa.func.count()).select_from(sessions).where(sa.text(RETRY_UNDECIDED))
        )
        if undecided:
            violations.add(f"{undecided} sessions' retries were never decided")
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
        decisions: dict[Any, Any] = dict(
            (
                await conn.execute(
                    sa.select(sessions.c.retry_decision, sa.func.count())
                    .where(sessions.c.retry_decision.is_not(None))
                    .group_by(sessions.c.retry_decision)
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
        "retry_decisions": {str(k): int(v) for k, v in decisions.items()},
        "sessions_total": sum(int(v) for v in by_status.values()),
        "submit_to_running_ms": running_ms,
        "mean_submit_to_running_ms": round(statistics.fmean(running_ms), 1) if running_ms else None,
    }


__all__ = ["AgentsProcess", "SimulationConfig", "SimulationError", "run_simulation"]
