"""`corral bench processes`: trivial jobs through a real manager and a real `process` agent.

A `corral manager` and one `corral agent --runtime process` run as separate processes, as a user
runs them, on a scratch database. The harness submits `--jobs` sessions of `true` (or of `sleep
S` with `--sleep S`) over REST (one cpu each, the agent offering `--slots` cpus) and waits for
all of them to end: with `--submit each` one POST per session, 32 in flight (a submit loop, on
the lean kept-alive client of `corral bench api`: httpx took most of a core of the two itself),
with `--submit array` one job array of them in one request (`sbatch --array`'s way).
From the sessions' `session.status_changed` events (the manager's clock) it reports jobs/s end
to end and the makespan (with `--sleep`, against the ideal: the jobs in waves of `--slots`),
submit → RUNNING p50/p95 (from the session's creation), the median time in each phase;
from /proc, the CPU the manager, the agent and the kernels (the agent's reaped children: the
exit-status wrappers and the kernels under them) spent per job; how many POSTs lost their
connection without an answer (each is sent again with its creation id, so counted once), and
how fast the API took the sessions in (`creates_per_s`, while the first of them ran).

Then, on the idle cluster, one session at a time: `--latency` sessions POSTed over REST, and
`--cli` calls of `corral run --detach`, each of `date +%s.%N`, the kernel's first act, whose
output (read as `corral run` reads it, the session's log followed to its end) says when the
process started. Submit → process start is from just before the POST is sent, or the CLI is
started, to that time (one clock: everything runs on this host); for the CLI calls also their
own wall time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from corral.bench._http import Http, HttpError, HttpxClient, KeepAliveClient
from corral.bench._scratch import scratch_database
from corral.bench.chaos.processes import Fleet, Manager, Supervised
from corral.domain.images import default_image
from corral.domain.status import SESSION_TERMINAL, SessionStatus
from corral.store.database import Database
from corral.store.tables import events, sessions
from corral.store.users import create_user, issue_token
from corral.testing.redis_server import free_port

JOIN_TOKEN = "bench-processes-join-token"
SUBMIT_CONCURRENCY = 32
# How the harness submits the jobs: a POST each, or one job array.
SUBMIT_MODES = ("each", "array")
MAX_SENDS = 5  # tries of one POST whose connection closed with no answer
SESSION_BODY: dict[str, Any] = {"image": "shell", "command": ["true"], "resources": {"cpu": 1}}
# The one-at-a-time sessions: the kernel prints the wall clock as it starts.
CLOCK_COMMAND = ("date", "+%s.%N")
CLOCK_BODY: dict[str, Any] = {
    "image": default_image(CLOCK_COMMAND),  # as `corral run` chooses it
    "command": list(CLOCK_COMMAND),
    "resources": {"cpu": 1},
}
# The phases a trivial job passes, each from the status entered to the next one's.
PHASES = (
    SessionStatus.PENDING,
    SessionStatus.SCHEDULED,
    SessionStatus.PREPARING,
    SessionStatus.PREPARED,
    SessionStatus.CREATING,
    SessionStatus.RUNNING,
    SessionStatus.TERMINATING,
    SessionStatus.TERMINATED,
)
_TICKS_S = os.sysconf("SC_CLK_TCK")


class ProcessesBenchError(RuntimeError):
    """The bench could not run to its end (a process died, jobs did not end in time)."""


async def run_processes_bench(
    jobs: int,
    slots: int,
    cli_calls: int,
    database: str,
    timeout_s: float,
    submit: str = "each",
    latency_sessions: int = 20,
    sleep_s: float = 0.0,
) -> dict[str, Any]:
    """Run the bench (see the module docstring); its figures as JSON-ready values."""
    if submit not in SUBMIT_MODES:
        raise ProcessesBenchError(
            f"submit must be one of {', '.join(SUBMIT_MODES)}, not {submit!r}"
        )
    body = _job_body(sleep_s)
    fleet = Fleet()
    with tempfile.TemporaryDirectory(prefix="corral-bench-processes-") as tmp:
        workdir = Path(tmp)
        async with AsyncExitStack() as stack:
            stack.callback(fleet.close)
            db = await stack.enter_async_context(scratch_database(database))
            now = datetime.now(UTC)
            user = await create_user(db, "bench", "admin", now)
            token = (await issue_token(db, user, "bench", now)).secret
            env = {**os.environ, "CORRAL_DATA_DIR": str(workdir / "data")}
            port = free_port()
            manager = Manager(
                "manager",
                [
                    *("manager", "--database", db.url.render_as_string(hide_password=False)),
                    *("--port", str(port), "--join-token", JOIN_TOKEN, "--log-level", "WARNING"),
                ],
                workdir / "manager.log",
                env,
                port=port,
            )
            agent = Supervised(
                "agent",
                [
                    *("agent", "--manager", manager.url, "--token", JOIN_TOKEN),
                    *("--id", "bench-agent", "--address", "127.0.0.1", "--runtime", "process"),
                    *("--slots", f"cpu={slots},mem={slots}g", "--log-level", "WARNING"),
                    *("--data-dir", str(workdir / "agent")),
                ],
                workdir / "agent.log",
                env,
            )
            fleet.managers.append(manager)
            fleet.agents.append(agent)
            manager.start()
            await manager.wait_ready()
            agent.start()
            await _until_agent(manager.url, token, agent)
            cpu_before = {p.name: _cpu_s(p) for p in (manager, agent)}
            begun = time.monotonic()
            if submit == "array":
                submitted, failed = await _submit_array(manager.url, token, jobs, body)
            else:
                submitted, failed = await _submit(manager.url, token, jobs, body)
            submit_s = time.monotonic() - begun
            if not await _until_ended(db, timeout_s - (time.monotonic() - begun)):
                raise ProcessesBenchError(f"the {jobs} jobs did not all end in {timeout_s} s")
            cpu_after = {p.name: _cpu_s(p) for p in (manager, agent)}
            figures = await _figures(db, submitted)
            rest_ids, rest_starts = await _rest_starts(manager.url, token, latency_sessions)
            one_at_a_time = await _figures(db, rest_ids) if rest_ids else {}
            cli, cli_starts = await _cli_calls(manager.url, token, cli_calls, env)
    cpu = {
        name: {
            part: (cpu_after[name][part] - cpu_before[name][part]) * 1000 / jobs
            for part in ("self", "children")
        }
        for name in cpu_after
    }
    return {
        "benchmark": "processes",
        "jobs": jobs,
        "slots": slots,
        "submit": submit,
        "command": body["command"][0],
        **figures,
        # The whole run against its ideal: the jobs in waves of `slots`, each wave `sleep_s`.
        "ideal_s": math.ceil(jobs / slots) * sleep_s if sleep_s else None,
        "cpu_ms_per_job": {
            "manager": round(cpu["manager"]["self"], 2),
            "agent": round(cpu["agent"]["self"], 2),
            "kernels": round(cpu["agent"]["children"], 2),
            "total": round(
                cpu["manager"]["self"] + cpu["agent"]["self"] + cpu["agent"]["children"], 2
            ),
        },
        "rest_submit_to_start_ms": _percentiles(rest_starts),
        "rest_phase_p50_ms": one_at_a_time.get("phase_p50_ms"),
        "cli_submit_to_start_ms": _percentiles(cli_starts),
        "cli_call_ms_p50": round(statistics.median(cli), 1) if cli else None,
        # Issue 35: a POST whose connection closed with no answer (sent again); should be 0.
        "submit_transport_errors": failed,
        # How fast the API took the jobs in, while the first of them ran (`each`: ≥ 500/s).
        "creates_per_s": round(jobs / submit_s, 1) if submit_s > 0 else None,
    }


async def _until_agent(url: str, token: str, agent: Supervised, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    async with _httpx(url, token, timeout_s=5.0) as http:
        while time.monotonic() < end:
            if not agent.running:
                raise ProcessesBenchError(f"the agent exited at start:\n{agent.tail()}")
            reply = await http.get("/v1/agents")
            if reply.status_code == 200 and any(
                a["status"] == "ALIVE" for a in reply.json()["items"]
            ):
                return
            await asyncio.sleep(0.1)  # polling a process start: no event to wait on
    raise ProcessesBenchError(f"the agent did not register in {deadline_s} s:\n{agent.tail()}")


def _job_body(sleep_s: float) -> dict[str, Any]:
    """A job of `true`, or of `sleep sleep_s` when that is above 0."""
    if sleep_s < 0:
        raise ProcessesBenchError(f"sleep must be 0 or more seconds, not {sleep_s!r}")
    return {**SESSION_BODY, "command": [f"sleep {sleep_s:g}"] if sleep_s else ["true"]}


async def _submit(url: str, token: str, count: int, job: dict[str, Any]) -> tuple[list[str], int]:
    """POST `count` sessions, SUBMIT_CONCURRENCY in flight; their ids, and how many requests
    failed on the wire (a connection closed with no answer: sent again, same creation id)."""
    ids: list[str] = []
    failed = 0
    left = list(range(count))
    run = uuid.uuid4().hex[:8]
    client = KeepAliveClient(url, token=token, timeout_s=30.0)

    async def worker() -> None:
        nonlocal failed
        while left:
            body = {**job, "creation_id": f"bench-{run}-{left.pop()}"}
            answer, lost = await _post(client, "/v1/sessions", body)
            failed += lost
            ids.append(str(answer["id"]))

    try:
        await asyncio.gather(*(worker() for _ in range(SUBMIT_CONCURRENCY)))
    finally:
        await client.close()
    return ids, failed


async def _submit_array(
    url: str, token: str, count: int, job: dict[str, Any]
) -> tuple[list[str], int]:
    """Submit `count` sessions as one job array (indices 0 to count - 1); their ids, and how
    many requests failed on the wire (sent again with the array's creation id)."""
    body = {**job, "array": f"0-{count - 1}", "creation_id": f"bench-{uuid.uuid4().hex}"}
    async with _httpx(url, token, timeout_s=60.0) as http:
        answer, failed = await _post(HttpxClient(http), "/v1/arrays", body)
    return [str(element["session_id"]) for element in answer["elements"]], failed


def _httpx(url: str, token: str, *, timeout_s: float) -> httpx.AsyncClient:
    """An httpx client of the manager at `url`, with the bench user's token."""
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s)


async def _post(client: Http, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The created (or found again) entity's JSON, and how many sends lost their connection
    with no answer (each sent again: the body's creation id makes it the same submission)."""
    lost = 0
    for _ in range(MAX_SENDS):
        try:
            reply = await client.request("POST", path, body)
            break
        except HttpError:
            lost += 1
    else:
        raise ProcessesBenchError(f"POST {path} failed {MAX_SENDS} times in a row")
    if reply.status not in (200, 201):
        raise ProcessesBenchError(f"POST {path}: {reply.status} {reply.text}")
    answer: dict[str, Any] = reply.json()
    return answer, lost


async def _until_ended(db: Database, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    terminal = [s.value for s in SESSION_TERMINAL]
    while time.monotonic() < end:
        async with db.read() as conn:
            open_ = await conn.scalar(
                sa.select(sa.func.count()).where(sessions.c.status.not_in(terminal))
            )
        if not open_:
            return True
        await asyncio.sleep(0.1)  # the harness watches rows it does not own: no hint to wait on
    return False


async def _figures(db: Database, ids: list[str]) -> dict[str, Any]:
    """Jobs/s, submit → RUNNING and the phases, from the sessions and their status events."""
    async with db.read() as conn:
        created = {
            str(row.id): row.created_at
            for row in await conn.execute(sa.select(sessions.c.id, sessions.c.created_at))
        }
        changes = await conn.execute(
            sa.select(events.c.entity_id, events.c.payload, events.c.created_at)
            .where(events.c.kind == "session.status_changed")
            .order_by(events.c.id)
        )
        # Created PENDING: no status change says so.
        reached = {i: {SessionStatus.PENDING.value: _aware(created[i])} for i in ids}
        for row in changes:
            if row.entity_id in reached:
                reached[row.entity_id].setdefault(row.payload["to"], _aware(row.created_at))
    to_running = [
        (times["RUNNING"] - _aware(created[i])).total_seconds() * 1000
        for i, times in reached.items()
        if "RUNNING" in times
    ]
    ends = [t.get("TERMINATED") or max(t.values()) for t in reached.values() if t]
    span_s = (max(ends) - min(_aware(created[i]) for i in ids)).total_seconds()
    phases = {}
    for entered, left in itertools.pairwise(PHASES):
        spent = [
            (times[left] - times[entered]).total_seconds() * 1000
            for times in reached.values()
            if entered in times and left in times
        ]
        if spent:
            phases[f"{entered}->{left}"] = round(statistics.median(spent), 1)
    ok = sum(1 for t in reached.values() if "TERMINATED" in t)
    return {
        "terminated": ok,
        "jobs_per_s": round(len(ids) / span_s, 1) if span_s > 0 else None,
        "makespan_s": round(span_s, 2),
        "submit_to_running_ms": _percentiles(to_running),
        "phase_p50_ms": phases,
    }


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 1),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
    }


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _cpu_s(process: Supervised) -> dict[str, float]:
    """The process's own CPU and its reaped children's, in seconds (/proc/<pid>/stat)."""
    assert process.process is not None
    fields = Path(f"/proc/{process.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) / _TICKS_S for f in fields[11:15])
    return {"self": utime + stime, "children": cutime + cstime}


async def _rest_starts(url: str, token: str, count: int) -> tuple[list[str], list[float]]:
    """`count` sessions POSTed one at a time: their ids, and each one's submit → process start
    in ms."""
    run = uuid.uuid4().hex[:8]
    ids, starts = [], []
    async with _httpx(url, token, timeout_s=30.0) as http:
        for index in range(count):
            body = {**CLOCK_BODY, "creation_id": f"bench-clock-{run}-{index}"}
            sent = time.time()
            answer, _ = await _post(HttpxClient(http), "/v1/sessions", body)
            ids.append(str(answer["id"]))
            started = await _start_time(http, ids[-1])
            starts.append((started - sent) * 1000)
    return ids, starts


async def _cli_calls(
    url: str, token: str, count: int, env: dict[str, str]
) -> tuple[list[float], list[float]]:
    """`count` calls of `corral run --detach` one at a time: each call's wall time, and each
    session's submit → process start (from the call's start), in ms."""
    cli_env = {**env, "CORRAL_URL": url, "CORRAL_TOKEN": token}
    walls, starts = [], []
    async with _httpx(url, token, timeout_s=30.0) as http:
        for _ in range(count):
            begun, sent = time.perf_counter(), time.time()
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "corral", "run", "--detach", "--", *CLOCK_COMMAND],
                env=cli_env,
                check=True,
                capture_output=True,
                text=True,
            )
            walls.append((time.perf_counter() - begun) * 1000)
            started = await _start_time(http, done.stdout.strip())
            starts.append((started - sent) * 1000)
    return walls, starts


async def _start_time(http: httpx.AsyncClient, session: str) -> float:
    """The wall clock a `date +%s.%N` session's kernel printed, read once the session ended
    (its log followed, as `corral run` does)."""
    reply = await http.get(f"/v1/sessions/{session}/logs", params={"follow": "true"})
    try:
        return float(reply.text.strip())
    except ValueError:
        raise ProcessesBenchError(
            f"session {session} printed {reply.text!r}, not the time it started "
            f"(GET logs: {reply.status_code})"
        ) from None
