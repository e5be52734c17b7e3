"""`corral chaos`: real managers and simulated agents under faults; checks; a report (JSON)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console

from corral._logging import configure_logging
from corral.bench.chaos.faults import Fault
from corral.bench.chaos.report import baseline_report, summary
from corral.bench.chaos.run import ChaosConfig, ChaosError, run_chaos
from corral.cli._common import fail

_err = Console(stderr=True)


def _seconds(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("s"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a duration in seconds (e.g. 5s)") from None
    if value < 0:
        raise typer.BadParameter(f"{text!r} must not be negative")
    return value


def chaos_command(
    managers: Annotated[int, typer.Option(min=1, help="Manager processes.")] = 3,
    agents: Annotated[int, typer.Option(min=1, help="Simulated agent processes.")] = 12,
    sessions: Annotated[int, typer.Option(min=1, help="Batch sessions to submit.")] = 2000,
    kill_every: Annotated[
        str, typer.Option(help="SIGKILL and restart one manager this often (0: never).")
    ] = "5s",
    max_kills: Annotated[
        int | None, typer.Option(min=0, help="Stop killing after this many kills.")
    ] = None,
    fault: Annotated[Fault, typer.Option(help="The outage besides the kills.")] = Fault.NONE,
    outage: Annotated[str, typer.Option(help="How long a redis/pg outage lasts.")] = "20s",
    outage_after: Annotated[str, typer.Option(help="When the outage begins.")] = "5s",
    database: Annotated[
        str, typer.Option(help="`sqlite`, or a postgresql:// server (a scratch database on it).")
    ] = "sqlite",
    redis: Annotated[
        str | None, typer.Option(help="redis:// URL, or `own` for a Redis of the run's own.")
    ] = None,
    agent_slots: Annotated[str, typer.Option(help="Each agent's slots.")] = "cpu=4,mem=16g",
    run_time: Annotated[str, typer.Option(help="Kernel run time, e.g. 0.5-3s.")] = "0.5-3s",
    baseline: Annotated[
        bool, typer.Option(help="Also run without faults and report the slowdown.")
    ] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds.")] = 900,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report only.")] = False,
) -> None:
    """Run sessions through real managers and agents while killing them; check; report."""
    config = ChaosConfig(
        managers=managers,
        agents=agents,
        sessions=sessions,
        kill_every_s=_seconds(kill_every),
        max_kills=max_kills,
        fault=fault,
        outage_s=_seconds(outage),
        outage_after_s=_seconds(outage_after),
        database=database,
        redis=redis,
        agent_slots=agent_slots,
        run_time=run_time,
        timeout_s=timeout,
    )
    configure_logging("WARNING")
    progress = None if as_json else (lambda message: _err.print(f"[dim]chaos: {message}[/]"))
    try:
        report = asyncio.run(run_chaos(config, progress))
        if baseline:
            clean = asyncio.run(run_chaos(config.without_faults(), progress))
            report = baseline_report(report, clean)
    except (ChaosError, TimeoutError) as exc:
        fail(f"chaos run did not complete: {exc or 'timed out'}", code=2)
    typer.echo(json.dumps(report) if as_json else summary(report))
    if report["violations"]:
        raise typer.Exit(1)
