"""`corral bench`: performance harnesses with JSON output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Annotated, Any, cast

import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from rich.console import Console

from corral.bench.endings import Path as EndingsPath
from corral.bench.endings import run_endings_bench
from corral.bench.latency import DEFAULT_TIMEOUT_S, LatencyBenchError, run_latency_bench
from corral.bench.schedule import run_schedule_bench
from corral.bench.store import run_store_bench
from corral.cli._common import fail, fail_unreachable, without_credentials

app = typer.Typer(help="Performance benchmarks (JSON output).", no_args_is_help=True)
# Where a bench runs, for the benches that can run on several backends in turn.
Databases = Annotated[
    list[str] | None,
    typer.Option(
        "--database",
        help="Where to run: `sqlite` (a temporary file) or a postgresql:// URL whose server "
        "gets a scratch database. Repeat to run on several backends.",
    ),
]
_err = Console(stderr=True)


def _print_results(
    benchmark: str,
    results: list[dict[str, Any]],
    as_json: bool,
    line: Callable[[dict[str, Any]], str],
) -> None:
    """The runs of a bench on several backends: one JSON document, or a `line` each."""
    if as_json:
        typer.echo(json.dumps({"benchmark": benchmark, "results": results}))
        return
    for result in results:
        typer.echo(line(result))


@app.command("store")
def store_command(
    database: Databases = None,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions, one kernel each.")] = 10_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Batched guarded status updates of sessions and kernels, with history."""
    results = []
    for url in database or ["sqlite"]:
        if not as_json:
            where = without_credentials(url)
            _err.print(f"[dim]bench store: {sessions} sessions on {where} ...[/]")
        results.append(asyncio.run(run_store_bench(url, sessions)).as_json())
    _print_results(
        "store",
        results,
        as_json,
        lambda r: (
            f"{r['backend']:>10}: {r['status_updates']} status updates in {r['seconds']} s = "
            f"{r['status_updates_per_s']}/s over {r['statements']} statements  {r['phase_ms']}"
        ),
    )


@app.command("schedule")
def schedule_command(
    database: Databases = None,
    agents: Annotated[int, typer.Option(min=1, help="Agents (64 cpu, 256 GiB each).")] = 1000,
    sessions: Annotated[int, typer.Option(min=1, help="Pending sessions.")] = 10_000,
    cluster_size: Annotated[
        int, typer.Option(min=1, help="Kernels per session (multi-node when > 1).")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """One scheduling pass, end to end: snapshot load, placement, one-transaction commit."""
    results = []
    for url in database or ["sqlite"]:
        if not as_json:
            _err.print(
                f"[dim]bench schedule: {sessions} sessions, {agents} agents on "
                f"{without_credentials(url)} ...[/]"
            )
        run = run_schedule_bench(url, agents=agents, sessions=sessions, cluster_size=cluster_size)
        results.append(asyncio.run(run).as_json())
    _print_results(
        "schedule",
        results,
        as_json,
        lambda r: (
            f"{r['backend']:>10}: placed {r['placed']}/{r['sessions']} on {r['agents']} agents in "
            f"{r['seconds']} s = {r['sessions_per_s']}/s (load {r['load_ms']} ms, placement "
            f"{r['placement_ms']} ms, commit {r['commit_ms']} ms); next pass over "
            f"{r['next_pass_targets']} left: {r['next_pass_ms']} ms"
        ),
    )


@app.command("dashboard")
def dashboard_command(
    database: Databases = None,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions stored.")] = 100_000,
    requests: Annotated[int, typer.Option(min=1, help="Loads of each page timed.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """The dashboard's pages with many sessions stored: p50 and p95 server time per page."""
    from corral.bench.dashboard import run_dashboard_bench

    results = []
    for url in database or ["sqlite"]:
        if not as_json:
            where = without_credentials(url)
            _err.print(f"[dim]bench dashboard: {sessions} sessions on {where} ...[/]")
        results.append(asyncio.run(run_dashboard_bench(url, sessions, requests)).as_json())
    _print_results(
        "dashboard",
        results,
        as_json,
        lambda r: (
            f"{r['backend']:>10}: {r['sessions']} sessions: "
            + ", ".join(f"{p} p95 {f['p95_ms']} ms" for p, f in r["pages"].items())
        ),
    )


@app.command("failover")
def failover_command(
    rounds: Annotated[int, typer.Option(min=1, max=100, help="Replicas made sick, in turn.")] = 5,
    replicas: Annotated[int, typer.Option(min=2, max=8, help="Replicas of the deployment.")] = 2,
    interval: Annotated[float, typer.Option(min=0.1, help="The health check's interval_s.")] = 1.0,
    failure_threshold: Annotated[
        int, typer.Option(min=1, help="The health check's failure_threshold.")
    ] = 3,
) -> None:
    """How soon a replica failing its health checks is out of the proxy's rotation (JSON),
    against failure_threshold x interval + 1 s; `corral up` runs in this process."""
    from corral.bench.failover import run_failover_bench

    typer.echo(
        json.dumps(run_failover_bench(rounds, replicas, interval, failure_threshold), indent=2)
    )


@app.command("endings")
def endings_command(
    database: Databases = None,
    running: Annotated[
        int, typer.Option(min=1, help="RUNNING sessions, one kernel each.")
    ] = 10_000,
    ending: Annotated[int, typer.Option(min=1, help="How many of them end.")] = 2_000,
    batch: Annotated[int, typer.Option(min=1, help="Kernels ended per report batch.")] = 20,
    path: Annotated[
        list[str] | None,
        typer.Option(
            "--path",
            help="`report` (promoted as each batch commits, as the manager does) or `tasks` "
            "(the promotion tasks after each batch). Repeat to run both.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Sessions ending by reports among many that keep running: the cost of an ending."""
    paths = path or ["report"]
    for p in paths:
        if p not in ("report", "tasks"):
            fail(f"--path: must be `report` or `tasks`, got {p!r}")
    if ending > running:
        fail(f"--ending: {ending} is more than the {running} --running sessions")
    results = []
    for url in database or ["sqlite"]:
        for p in paths:
            if not as_json:
                _err.print(
                    f"[dim]bench endings: {ending} of {running} end, path {p}, on "
                    f"{without_credentials(url)} ...[/]"
                )
            run = run_endings_bench(
                url, running=running, ending=ending, batch=batch, path=cast(EndingsPath, p)
            )
            results.append(asyncio.run(run).as_json())
    _print_results(
        "endings",
        results,
        as_json,
        lambda r: (
            f"{r['backend']:>10} ({r['path']}): {r['ending']} of {r['running']} RUNNING ended in "
            f"{r['seconds']} s = {r['us_per_ending']} µs an ending (batches of {r['batch']})"
        ),
    )


@app.command("latency")
def latency_command(
    database: Annotated[
        str,
        typer.Option(
            "--database",
            help="`sqlite` (a temporary file) or a postgresql:// URL whose server gets a "
            "scratch database.",
        ),
    ] = "sqlite",
    redis: Annotated[
        str | None,
        typer.Option(
            "--redis",
            help="A redis:// URL: hints, locks and events through Redis. Without it: "
            "PostgreSQL's with a postgresql:// database, in-process with SQLite.",
        ),
    ] = None,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions to submit (1 cpu each).")] = 1000,
    rate: Annotated[float, typer.Option(min=0.1, help="Submissions per second.")] = 100.0,
    agents: Annotated[int, typer.Option(min=1, help="Instant agents (64 cpu, 256 GiB each).")] = 50,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds to wait after the last submission.")
    ] = DEFAULT_TIMEOUT_S,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Submit → RUNNING latency at a steady submission rate, against instant test agents."""
    if sessions > agents * 64:
        fail(f"{sessions} sessions do not fit on {agents} agents of 64 cpu; raise --agents")

    def progress(line: str) -> None:
        if _err.is_terminal:
            _err.print(f"[dim]bench latency: {line}[/]")

    if not as_json:
        _err.print(f"[dim]bench latency: {sessions} sessions at {rate:g}/s on {database} ...[/]")
    run = run_latency_bench(
        database,
        redis_url=redis,
        sessions=sessions,
        rate_per_s=rate,
        agents=agents,
        timeout_s=timeout_s,
        progress=progress,
    )
    try:
        result = asyncio.run(run).as_json()
    except LatencyBenchError as exc:
        fail(str(exc), code=1)
    except (OSError, RedisConnectionError) as exc:
        fail_unreachable(exc)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(
            f"{result['backend']:>17}: {result['running']}/{result['sessions']} RUNNING at "
            f"{result['rate_per_s']:g}/s: p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
            f"max {result['max_ms']} ms"
        )
        hops = result["hops_ms"]
        assert isinstance(hops, dict)
        for hop, figures in hops.items():
            typer.echo(f"{hop:>22}: p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms")
    if result["running"] != sessions:
        fail(f"only {result['running']} of {sessions} sessions reached RUNNING", code=1)


@app.command("processes")
def processes_command(
    jobs: Annotated[
        int, typer.Option(min=1, help="Jobs to run (1 cpu each): `true`, or `sleep S`.")
    ] = 1000,
    slots: Annotated[int, typer.Option(min=1, help="The agent's cpus (jobs at once).")] = 64,
    latency: Annotated[
        int,
        typer.Option(min=0, help="Sessions POSTed one at a time after: submit -> process start."),
    ] = 20,
    cli: Annotated[
        int, typer.Option(min=0, help="Timed `corral run --detach` calls after, one at a time.")
    ] = 10,
    sleep_s: Annotated[
        float,
        typer.Option(
            "--sleep", min=0, help="Jobs of `sleep S` instead of `true` (S > 0): makespan vs ideal."
        ),
    ] = 0.0,
    database: Annotated[
        str, typer.Option("--database", help="`sqlite` (a temporary file) or a postgresql:// URL.")
    ] = "sqlite",
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds the jobs may take in all.")
    ] = 600.0,
    submit: Annotated[
        str,
        typer.Option(
            "--submit",
            help="`each`: a POST per job, 32 in flight; `array`: one job array of them all.",
        ),
    ] = "each",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Trivial jobs through a real manager and a real process agent: jobs/s, latency, CPU."""
    from corral.bench.processes import SUBMIT_MODES, ProcessesBenchError, run_processes_bench

    if submit not in SUBMIT_MODES:
        fail(f"--submit must be one of {', '.join(SUBMIT_MODES)}, not {submit!r}", code=2)
    if not as_json:
        what = f"sleep {sleep_s:g}" if sleep_s else "true"
        _err.print(f"[dim]bench processes: {jobs} x {what} on {slots} slots ({submit}) ...[/]")
    try:
        result = asyncio.run(
            run_processes_bench(jobs, slots, cli, database, timeout_s, submit, latency, sleep_s)
        )
    except ProcessesBenchError as exc:
        fail(str(exc), code=1)
    if as_json:
        typer.echo(json.dumps(result))
        return
    to_running = result["submit_to_running_ms"] or {}
    typer.echo(
        f"{result['terminated']}/{jobs} jobs ended, {result['jobs_per_s']} jobs/s; submit -> "
        f"RUNNING p50 {to_running.get('p50')} ms, p95 {to_running.get('p95')} ms"
    )
    if result["ideal_s"]:
        typer.echo(
            f"makespan {result['makespan_s']} s, ideal {result['ideal_s']} s "
            f"({result['makespan_s'] / result['ideal_s']:.2f}x)"
        )
    typer.echo(f"CPU per job (ms): {result['cpu_ms_per_job']}")
    typer.echo(f"phases (p50 ms): {result['phase_p50_ms']}")
    for how, key in (("REST", "rest_submit_to_start_ms"), ("CLI", "cli_submit_to_start_ms")):
        figures = result[key] or {}
        typer.echo(
            f"submit -> process start, one at a time ({how}): p50 {figures.get('p50')} ms, "
            f"p95 {figures.get('p95')} ms"
        )
    typer.echo(f"corral run --detach: p50 {result['cli_call_ms_p50']} ms")
    typer.echo(f"POSTs that lost their connection: {result['submit_transport_errors']}")
