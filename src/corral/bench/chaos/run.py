"""One `corral chaos` run: start the cluster, submit, inject the fault, wait, collect, check."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from corral.agent.runtime.sim_journal import JOURNAL_NAME, read_journal
from corral.bench._scratch import scratch_database
from corral.bench.chaos import checks
from corral.bench.chaos.faults import (
    Fault,
    FaultLog,
    kill_agents,
    kill_managers,
    pg_outage,
    redis_outage,
)
from corral.bench.chaos.processes import Fleet, Manager, Supervised
from corral.domain.slots import ResourceSlots
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.tables import agents, kernel_history, kernels, session_history, sessions
from corral.store.users import create_user, issue_token
from corral.testing.redis_server import RedisServer, free_port
from corral.testing.tcp_proxy import TcpProxy

JOIN_TOKEN = "chaos-join-token"
OWN_REDIS = "own"  # --redis own: a Redis of the run's own
SAMPLE_EVERY_S = 0.5
REGISTER_DEADLINE_S = 60.0
CHECK_MARGIN_S = 20.0  # of --timeout, kept for collecting and checking after the wait
SUBMIT_CONCURRENCY = 16
SESSION_BODY: dict[str, Any] = {"image": "python", "command": ["true"], "resources": {"cpu": 1}}

Progress = Callable[[str], None]


class ChaosError(RuntimeError):
    """The run could not be carried out (a process did not start, the timeout passed)."""


@dataclass(frozen=True)
class ChaosConfig:
    """What to run and what to break."""

    managers: int = 3
    agents: int = 12
    sessions: int = 2000
    kill_every_s: float = 5.0  # 0: no manager kills
    max_kills: int | None = None
    fault: Fault = Fault.NONE
    outage_after_s: float = 5.0
    outage_s: float = 20.0
    database: str = "sqlite"  # or a postgresql:// server URL (a scratch database is made on it)
    redis: str | None = None  # a redis:// URL, OWN_REDIS, or None (no Redis)
    agent_slots: str = "cpu=4,mem=16g"
    run_time: str = "0.5-3s"
    timeout_s: float = 600.0

    def without_faults(self) -> ChaosConfig:
        """The same run with no kill and no outage: the baseline."""
        return replace(self, kill_every_s=0.0, fault=Fault.NONE)


async def run_chaos(config: ChaosConfig, progress: Progress | None = None) -> dict[str, Any]:
    """One run, bounded by `config.timeout_s`; its report (figures and checks)."""
    say = progress or (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix="corral-chaos-") as tmp:
        run = asyncio.ensure_future(
            asyncio.wait_for(_run(config, Path(tmp), say), config.timeout_s)
        )
        # SIGTERM cleans up as Ctrl-C does: the run is cancelled and its exit stack unwinds.
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, run.cancel)
        try:
            return await run
        finally:
            loop.remove_signal_handler(signal.SIGTERM)


async def _run(config: ChaosConfig, workdir: Path, say: Progress) -> dict[str, Any]:
    fleet = Fleet()
    log = FaultLog()
    begun = time.monotonic()
    async with AsyncExitStack() as stack:
        stack.callback(fleet.close)  # runs on any exit, cancellation (timeout, Ctrl-C) too
        db = await stack.enter_async_context(scratch_database(config.database))
        redis_url = config.redis
        server: RedisServer | None = None
        if config.fault is Fault.REDIS or redis_url == OWN_REDIS:
            server = RedisServer(workdir / "redis").start()
            stack.callback(server.kill)
            redis_url = server.url
        manager_db = db.url
        proxy: TcpProxy | None = None
        if config.fault is Fault.PG:
            if db.url.get_backend_name() != "postgresql":
                raise ChaosError("--fault pg needs a postgresql:// --database")
            proxy = await TcpProxy(db.url.host or "127.0.0.1", db.url.port or 5432).start()
            stack.push_async_callback(proxy.close)
            manager_db = db.url.set(host="127.0.0.1", port=proxy.port)
        token = await _admin_token(db)
        env = {
            **os.environ,
            "CORRAL_DATA_DIR": str(workdir / "data"),
            "CORRAL_LOG_LEVEL": "WARNING",
        }
        db_arg = manager_db.render_as_string(hide_password=False)
        for i in range(config.managers):
            port = free_port()
            args = [
                "manager",
                "--database",
                db_arg,
                "--port",
                str(port),
                "--join-token",
                JOIN_TOKEN,
                "--log-level",
                "WARNING",
            ]
            if redis_url:
                args += ["--redis", redis_url]
            fleet.managers.append(
                Manager(f"manager-{i}", args, workdir / f"manager-{i}.log", env, port=port)
            )
        for manager in fleet.managers:
            manager.start()
        for manager in fleet.managers:
            await manager.wait_ready()
        say(f"{config.managers} managers up")
        urls = [m.url for m in fleet.managers]
        for i in range(config.agents):
            name = f"chaos-agent-{i:02d}"
            # Each agent prefers a different manager first, so the load spreads over them.
            mine = urls[i % len(urls) :] + urls[: i % len(urls)]
            fleet.agents.append(
                Supervised(
                    name,
                    [
                        "agent",
                        "--manager",
                        ",".join(mine),
                        "--token",
                        JOIN_TOKEN,
                        "--id",
                        name,
                        "--address",
                        "127.0.0.1",
                        "--runtime",
                        "simulated",
                        "--slots",
                        config.agent_slots,
                        "--data-dir",
                        str(workdir / "agents" / name),
                        "--sim-run-time",
                        config.run_time,
                        "--sim-seed",
                        str(i),
                        "--log-level",
                        "WARNING",
                    ],
                    workdir / f"{name}.log",
                    env,
                )
            )
        for agent in fleet.agents:
            agent.start()
        if not await _until(lambda: _alive_agents(db, config.agents), REGISTER_DEADLINE_S):
            raise ChaosError(f"the agents did not all register in {REGISTER_DEADLINE_S:g} s")
        say(f"{config.agents} agents up; submitting {config.sessions} sessions")

        samples: list[checks.Ledger] = []
        progress_series: list[tuple[float, int]] = []
        log.started = time.monotonic()
        faults = _faults(config, fleet, server, proxy, log)
        exits: list[tuple[str, int | None]] = []
        sampler = asyncio.create_task(_sample(db, fleet, samples, exits, progress_series, log))
        try:
            accepted = await _submit(urls, token, config.sessions)
            say(f"{len(accepted)} sessions accepted; waiting for them to end")
            # What does not end before the timeout (less time for the checks) is reported by them.
            wait_s = config.timeout_s - (time.monotonic() - begun) - CHECK_MARGIN_S
            all_ended = await _until(lambda: _all_ended(db), wait_s)
            took_s = log.now()
        finally:
            for task in (*faults, sampler):
                task.cancel()
            await asyncio.gather(*faults, sampler, return_exceptions=True)
        for agent in fleet.agents:
            agent.kill()  # the journals are complete: the agents stop writing
        journals = {
            a.name: list(read_journal(workdir / "agents" / a.name / JOURNAL_NAME))
            for a in fleet.agents
        }
        results = await _check(db, accepted, samples, journals, config)
        results.append(checks.no_exit(exits, len(samples)))
        return {
            "config": {k: (str(v) if isinstance(v, Fault) else v) for k, v in vars(config).items()},
            "database": db.url.get_backend_name(),
            "redis": bool(redis_url),
            "accepted": len(accepted),
            "all_ended": all_ended,
            "took_s": round(took_s, 2),
            "manager_kills": log.manager_kills,
            "agent_kills": log.agent_kills,
            "outages": [[round(a, 2), round(b, 2)] for a, b in log.outages],
            "ended_during_outages": _ended_during(progress_series, log.outages),
            "resumed_after_outages_s": _resumed_after(progress_series, log.outages),
            "manager_restarts": sum(m.starts - 1 for m in fleet.managers),
            "checks": [vars(r) | {"name": str(r.name)} for r in results],
            "violations": sum(r.violations for r in results),
        }
    raise AssertionError("unreachable")  # pragma: no cover  (the stack does not swallow)


def _faults(
    config: ChaosConfig,
    fleet: Fleet,
    server: RedisServer | None,
    proxy: TcpProxy | None,
    log: FaultLog,
) -> list[asyncio.Task[None]]:
    tasks: list[asyncio.Task[None]] = []
    if config.kill_every_s > 0:
        tasks.append(
            asyncio.create_task(
                kill_managers(fleet.managers, config.kill_every_s, config.max_kills, log)
            )
        )
    if config.fault is Fault.AGENT:
        every = config.kill_every_s or 5.0
        tasks.append(asyncio.create_task(kill_agents(fleet.agents, every, config.max_kills, log)))
    if config.fault is Fault.REDIS and server is not None:
        tasks.append(redis_outage(server, config.outage_after_s, config.outage_s, log))
    if config.fault is Fault.PG and proxy is not None:
        tasks.append(pg_outage(proxy, config.outage_after_s, config.outage_s, log))
    return tasks


async def _admin_token(db: Database) -> str:
    now = datetime.now(UTC)
    user = await create_user(db, f"chaos-{uuid.uuid4().hex[:8]}", "admin", now)
    return (await issue_token(db, user, "chaos", now)).secret


async def _submit(urls: list[str], token: str, count: int) -> dict[str, str]:
    """POST `count` sessions, spread over the managers; a refused or cut request is retried on
    the next manager with the same creation id (idempotent). Accepted id -> creation id."""
    accepted: dict[str, str] = {}
    queue = list(range(count))
    headers = {"Authorization": f"Bearer {token}"}

    async def one(http: httpx.AsyncClient, n: int) -> None:
        creation = f"chaos-{n}-{uuid.uuid4().hex[:8]}"
        for attempt in range(200):
            url = urls[(n + attempt) % len(urls)]
            with contextlib.suppress(httpx.HTTPError):
                reply = await http.post(
                    f"{url}/v1/sessions",
                    json={**SESSION_BODY, "creation_id": creation},
                    headers=headers,
                )
                if reply.status_code in (200, 201):
                    accepted[str(reply.json()["id"])] = creation
                    return
                if 400 <= reply.status_code < 500 and reply.status_code not in (408, 429):
                    raise ChaosError(f"POST /v1/sessions refused: {reply.status_code} {reply.text}")
            await asyncio.sleep(0.1)  # a manager being restarted: try the next one shortly

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            await one(http, queue.pop())

    async with httpx.AsyncClient(timeout=10.0) as http:
        await asyncio.gather(*(worker(http) for _ in range(SUBMIT_CONCURRENCY)))
    return accepted


async def _alive_agents(db: Database, count: int) -> bool:
    async with db.read() as conn:
        alive = await conn.scalar(sa.select(sa.func.count()).where(agents.c.status == "ALIVE"))
    return (alive or 0) >= count


async def _all_ended(db: Database) -> bool:
    async with db.read() as conn:
        open_ = await conn.scalar(
            sa.select(sa.func.count()).where(
                sessions.c.status.not_in([s.value for s in checks.TERMINAL])
            )
        )
    return not open_


async def _until(condition: Callable[[], Any], deadline_s: float) -> bool:
    """Poll `condition()` until it holds (True) or `deadline_s` passes (False)."""
    end = time.monotonic() + deadline_s
    while not await condition():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.25)
    return True


async def _sample(
    db: Database,
    fleet: Fleet,
    samples: list[checks.Ledger],
    exits: list[tuple[str, int | None]],
    series: list[tuple[float, int]],
    log: FaultLog,
) -> None:
    """Every SAMPLE_EVERY_S: processes that ended by themselves (restarted), the slot ledger,
    and how many sessions have ended."""
    while True:
        exits.extend(fleet.restart_exited())
        with contextlib.suppress(Exception):  # a sample missed is not a violation
            samples.append(await read_ledger(db))
            async with db.read() as conn:
                ended = await conn.scalar(
                    sa.select(sa.func.count()).where(
                        sessions.c.status.in_([s.value for s in checks.TERMINAL])
                    )
                )
            series.append((log.now(), int(ended or 0)))
        await asyncio.sleep(SAMPLE_EVERY_S)


def _ended_during(series: list[tuple[float, int]], windows: list[tuple[float, float]]) -> list[int]:
    """Sessions that ended within each outage window (progress during the outage)."""
    out = []
    for begin, end in windows:
        inside = [n for t, n in series if begin <= t <= end]
        out.append(inside[-1] - inside[0] if inside else 0)
    return out


def _resumed_after(
    series: list[tuple[float, int]], windows: list[tuple[float, float]]
) -> list[float | None]:
    """Seconds from each outage's end to the first sample with more sessions ended than at its
    end (None: none ended after it); the resolution is the sampling interval."""
    out: list[float | None] = []
    for _, end in windows:
        before = [n for t, n in series if t <= end]
        at_end = before[-1] if before else 0
        after = [t for t, n in series if t > end and n > at_end]
        out.append(round(after[0] - end, 2) if after else None)
    return out


async def _check(
    db: Database,
    accepted: dict[str, str],
    samples: list[checks.Ledger],
    journals: dict[str, list[Any]],
    config: ChaosConfig,
) -> list[checks.CheckResult]:
    async with db.read() as conn:
        statuses = {
            str(i): s for i, s in await conn.execute(sa.select(sessions.c.id, sessions.c.status))
        }
        held = [
            (a, dict(s))
            for a, s in await conn.execute(
                sa.select(kernels.c.agent_id, kernels.c.occupied_slots).where(
                    kernels.c.occupied_slots.is_not(None), kernels.c.agent_id.is_not(None)
                )
            )
        ]
        edges = []
        for table in (session_history, kernel_history):
            rows = await conn.execute(
                sa.select(table.c.from_status, table.c.to_status, sa.func.count()).group_by(
                    table.c.from_status, table.c.to_status
                )
            )
            edges.append([(a, b, int(n)) for a, b, n in rows])
    ledger = await read_ledger(db)
    per_agent = ResourceSlots.parse(config.agent_slots).to_milli()
    capacity = {name: per_agent for name in journals}
    return [
        checks.all_terminal(accepted, statuses),
        checks.no_double_start(journals),
        checks.no_overcommit(samples, journals, capacity),
        checks.ledger_matches(ledger, held),
        checks.legal_history(edges[0], edges[1]),
    ]
