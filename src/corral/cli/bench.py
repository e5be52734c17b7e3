"""`corral bench`: performance harnesses with JSON output."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console

from corral.bench.schedule import run_schedule_bench
from corral.bench.store import run_store_bench

app = typer.Typer(help="Performance benchmarks (JSON output).", no_args_is_help=True)
_err = Console(stderr=True)


@app.command("store")
def store_command(
    database: Annotated[
        list[str] | None,
        typer.Option(
            "--database",
            help="Where to run: `sqlite` (a temporary file) or a postgresql:// URL whose "
            "server gets a scratch database. Repeat to run on several backends.",
        ),
    ] = None,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions, one kernel each.")] = 10_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Batched guarded status updates of sessions and kernels, with history."""
    results = []
    for url in database or ["sqlite"]:
        if not as_json:
            _err.print(f"[dim]bench store: {sessions} sessions on {url.split('@')[-1]} ...[/]")
        results.append(asyncio.run(run_store_bench(url, sessions)).as_json())
    output = {"benchmark": "store", "results": results}
    if as_json:
        typer.echo(json.dumps(output))
        return
    for r in results:
        typer.echo(
            f"{r['backend']:>10}: {r['status_updates']} status updates in {r['seconds']} s = "
            f"{r['status_updates_per_s']}/s over {r['statements']} statements  {r['phase_ms']}"
        )


@app.command("schedule")
def schedule_command(
    database: Annotated[
        list[str] | None,
        typer.Option(
            "--database",
            help="`sqlite` (a temporary file) or a postgresql:// URL whose server gets a "
            "scratch database. Repeat to run on several backends.",
        ),
    ] = None,
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
            _err.print(f"[dim]bench schedule: {sessions} sessions, {agents} agents on {url} ...[/]")
        run = run_schedule_bench(url, agents=agents, sessions=sessions, cluster_size=cluster_size)
        results.append(asyncio.run(run).as_json())
    if as_json:
        typer.echo(json.dumps({"benchmark": "schedule", "results": results}))
        return
    for r in results:
        typer.echo(
            f"{r['backend']:>10}: placed {r['placed']}/{r['sessions']} on {r['agents']} agents in "
            f"{r['seconds']} s = {r['sessions_per_s']}/s (load {r['load_ms']} ms, placement "
            f"{r['placement_ms']} ms, commit {r['commit_ms']} ms)"
        )
