"""`corral bench api`: creating and reading sessions over HTTP, against a real manager.

The manager is the one `corral manager` runs (`ManagerDaemon`: store, buses, coordinator loops,
uvicorn) on a scratch database, in this process; by default on the embedded defaults (a SQLite
file, in-process hints, locks and events). The requests come from a second Python process
(`corral.bench._api_load`), so the client's own work does not slow the server's event loop.
By default the cluster has room for every session: silent agents (rows that never poll; their
heartbeat timeout is an hour) take them, so each session is placed and asked to prepare, then
waits in PREPARING; `agents=0` leaves every session PENDING, as on a full cluster, where every
submission's hint makes the scheduler pass over the whole queue.

Two phases, after a few warm-up requests that are not counted:
- create: `sessions` POSTs by `concurrency` workers, each sending its next request when its last
  one answered (closed loop); creates/s is the created sessions over the phase's wall time;
- read, once the coordinator has digested the burst (no run of any of its loops ended for
  `QUIET_S`; the wait is reported): GETs of the created sessions at a fixed rate for a fixed
  time, each request at its slot in its own task (open loop: a slow answer does not delay the
  next), so latency includes any queueing in the server.
The coordinator shares the server's event loop, so while it digests, reads wait behind its runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

from corral.bench._api_load import (
    WARMUP_REQUESTS,
    ApiBenchError,
    ApiFigures,
    ApiLoad,
    Progress,
    measure,
)
from corral.bench._scratch import scratch_database
from corral.bench.latency import AGENT_CPU_MILLI, AGENT_MEM_MILLI, percentile
from corral.controller.agents import AgentTimings
from corral.coordination.loop import DualLoop
from corral.domain.record import record
from corral.domain.types import AgentId, utcnow
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.store.agents import NewAgent, insert_agents
from corral.store.database import Database
from corral.store.users import create_user, issue_token

__all__ = [
    "ApiBenchError",
    "ApiBenchResult",
    "ApiFigures",
    "ApiLoad",
    "measure",
    "run_api_bench",
]

SESSIONS_PER_AGENT = AGENT_CPU_MILLI // 1000  # each session asks for 1 cpu
# Silent agents never heartbeat: the manager must not find them lost during the run.
SILENT_AGENT_TIMINGS = AgentTimings(heartbeat_timeout_s=3600.0)
QUIET_S = 2.0  # the coordinator has digested the creates once no run ended for this long
SETTLE_TIMEOUT_S = 300.0
_SETTLE_POLL_S = 0.05
# The load generator's output kept for an error message when it fails.
_STDERR_TAIL_LINES = 20
_LINE_LIMIT_BYTES = 64 * 1024 * 1024  # its answer is one JSON line with every latency


@record
class ApiBenchResult:
    """Figures of one run."""

    backend: str
    agents: int
    load: ApiLoad
    figures: ApiFigures
    settle_s: float  # between the phases, until the coordinator was quiet

    def as_json(self) -> dict[str, object]:
        load, figures = self.load, self.figures
        created = len(figures.create_ms)
        return {
            "benchmark": "api",
            "backend": self.backend,
            "agents": self.agents,
            "sessions": load.sessions,
            "created": created,
            "concurrency": load.concurrency,
            "create_s": round(figures.create_s, 3),
            "create_per_s": round(created / figures.create_s, 1) if figures.create_s > 0 else None,
            "create_p50_ms": _ms(percentile(figures.create_ms, 0.5)),
            "create_p99_ms": _ms(percentile(figures.create_ms, 0.99)),
            "settle_s": round(self.settle_s, 2),
            "get_rate_per_s": load.get_rate_per_s,
            "get_requests": len(figures.get_ms),
            "achieved_get_rate_per_s": round((load.get_requests - 1) / figures.get_s, 1)
            if figures.get_s > 0
            else None,
            "get_p50_ms": _ms(percentile(figures.get_ms, 0.5)),
            "get_p90_ms": _ms(percentile(figures.get_ms, 0.9)),
            "get_p99_ms": _ms(percentile(figures.get_ms, 0.99)),
            "get_max_ms": _ms(max(figures.get_ms, default=math.nan)),
            "errors": sum(figures.errors.values()),
            "errors_by_kind": dict(sorted(figures.errors.items())),
            "error_samples": list(figures.error_samples),
        }


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


async def run_api_bench(
    database: str = "sqlite",
    load: ApiLoad | None = None,
    *,
    agents: int | None = None,
    progress: Progress | None = None,
) -> ApiBenchResult:
    """Start a manager on a scratch copy of `database`, load its API from a second process.

    `database` is `sqlite` (a temporary file) or a postgresql:// URL whose server gets a
    scratch database, dropped afterwards. `agents` silent agents of 64 cpu join first (None:
    as many as every session needs; 0: none, so every session stays PENDING).
    """
    load = load or ApiLoad()
    if agents is None:
        agents = math.ceil((load.sessions + WARMUP_REQUESTS) / SESSIONS_PER_AGENT)
    if agents < 0:
        raise ValueError(f"agents must be 0 or more, got {agents}")
    async with scratch_database(database) as scratch:
        url = scratch.url.render_as_string(hide_password=False)
        backend = scratch.dialect
        await scratch.close()  # the manager opens its own; the scratch one waits to drop it
        config = ManagerConfig(
            database_url=url, port=0, timings=SILENT_AGENT_TIMINGS, grace_period_s=5.0
        )
        daemon = ManagerDaemon(config)
        runner = await daemon.start()
        try:
            assert daemon.parts is not None
            token = await _admin_token(daemon.parts.db)
            await _add_silent_agents(daemon.parts.db, agents)
            if progress is not None:
                progress(f"manager on {backend} at {daemon.url}, {agents} agents; loading it")
            loops = daemon.parts.orchestrator.loops
            figures, settle_s = await _generate_load(
                daemon.url, token, load, lambda: _until_quiet(loops), progress
            )
        finally:
            await daemon.stop()
            await runner  # re-raises a crash of the manager
    return ApiBenchResult(backend, agents, load, figures, settle_s)


async def _until_quiet(loops: Sequence[DualLoop]) -> float:
    """Wait until no run of `loops` has ended for QUIET_S; the seconds waited."""
    clock = asyncio.get_running_loop().time
    started = changed_at = clock()
    seen = -1
    while clock() - changed_at < QUIET_S:
        if clock() - started > SETTLE_TIMEOUT_S:
            raise ApiBenchError(
                f"the coordinator was still busy {SETTLE_TIMEOUT_S:g} s after the last create"
            )
        ended = sum(loop.runs + loop.failures for loop in loops)
        if ended != seen:
            seen, changed_at = ended, clock()
        await asyncio.sleep(_SETTLE_POLL_S)  # polling counters the loops keep; no event exists
    return clock() - started


async def _admin_token(db: Database) -> str:
    """A fresh admin user's token on the manager's database."""
    now = utcnow()
    user_id = await create_user(db, f"bench-{uuid.uuid4().hex[:8]}", "admin", now)
    return (await issue_token(db, user_id, "bench api", now)).secret


async def _add_silent_agents(db: Database, count: int) -> None:
    """`count` agents of 64 cpu and 256 GiB that never poll: room for sessions, no answers."""
    await insert_agents(
        db,
        [
            NewAgent(
                AgentId(f"bench-api-{i:04d}"),
                f"10.1.{i // 250}.{i % 250}:6001",
                {"cpu": AGENT_CPU_MILLI, "mem": AGENT_MEM_MILLI},
            )
            for i in range(count)
        ],
        utcnow(),
    )


async def _generate_load(
    url: str,
    token: str,
    load: ApiLoad,
    between: Callable[[], Awaitable[float]],
    progress: Progress | None,
) -> tuple[ApiFigures, float]:
    """Run the load generator process against `url`: its figures, and what `between` returned.

    The process speaks JSON lines: it reads the plan, says `{"created": n}` after the create
    phase and waits for a line back (sent once `between` returns), then prints its answer.
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.bench._api_load",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=_LINE_LIMIT_BYTES,
    )
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    tail: list[str] = []

    async def relay(stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            tail[:] = [*tail[-(_STDERR_TAIL_LINES - 1) :], line]
            if progress is not None:
                progress(line)

    relayed = asyncio.create_task(relay(process.stderr), name="bench-load-stderr")
    between_s = 0.0
    answer: dict[str, Any] | None = None
    try:
        # The token goes through stdin, never the command line other users can read.
        plan = {"url": url, "token": token, "load": asdict(load)}
        await _send(process.stdin, plan)
        async for raw in process.stdout:
            message = json.loads(raw)
            if "created" in message:
                between_s = await between()
                await _send(process.stdin, {"read": True})
            else:
                answer = message
        await relayed
        code = await process.wait()
    except (ValueError, ConnectionError):
        answer = None  # the process died or printed something else: its stderr says why
        code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        relayed.cancel()
    if answer is None:
        detail = "\n".join(tail) or "(no output)"
        raise ApiBenchError(f"the load generator failed (exit code {code}):\n{detail}")
    if "error" in answer:
        raise ApiBenchError(answer["error"], status=answer.get("status"))
    return ApiFigures(**answer["figures"]), between_s


async def _send(stream: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    await stream.drain()
