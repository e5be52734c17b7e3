"""`corral simulate`: a manager and simulated agents running sessions end to end (JSON)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from corral._logging import configure_logging
from corral.bench.simulate import SimulationConfig, SimulationError, run_simulation
from corral.cli._common import fail
from corral.domain.retry.policy import MAX_RETRIES

_err = Console(stderr=True)


def simulate_command(
    agents: Annotated[
        int, typer.Option(min=1, help="Simulated agents (8 cpu, 32 GiB each).")
    ] = 100,
    sessions: Annotated[int, typer.Option(min=1, help="Batch sessions to run.")] = 1_000,
    cluster_size: Annotated[
        int, typer.Option(min=1, max=64, help="Kernels per session (multi-node when > 1).")
    ] = 1,
    fail_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Chance that a kernel fails somewhere.")
    ] = 0.0,
    database: Annotated[
        str,
        typer.Option(help="`sqlite` (a temporary file) or a postgresql:// URL (scratch db)."),
    ] = "sqlite",
    redis: Annotated[
        str | None, typer.Option(help="redis:// URL for hints, locks, events.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the simulated faults.")] = 0,
    upload: Annotated[
        Path | None,
        typer.Option(
            help="A directory every session names as its upload: each kernel fetches it over "
            "the agents' link and unpacks it, as with `corral run --upload`.",
            exists=True,
            file_okay=False,
        ),
    ] = None,
    retries: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_RETRIES,
            help="A retry policy on every session: failed ones are retried this many times "
            "(the run ends when every retry chain has).",
        ),
    ] = 0,
    retry_delay: Annotated[
        float, typer.Option(min=0, help="Seconds before each retry (with --retries).")
    ] = 0.0,
    wait_for_kernels_ready: Annotated[
        bool,
        typer.Option(
            help="Turn all-or-nothing admission on (without blocking) in the default group."
        ),
    ] = False,
    dashboards: Annotated[
        int,
        typer.Option(
            min=0,
            max=1000,
            help="Also run it with this many dashboards open on the manager (signed in, "
            "following its live stream, refreshing their pages as a browser does), and "
            "report the lifecycle throughput with and without them.",
        ),
    ] = 0,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="With --dashboards: pairs of runs, without then with them; the loss is the "
            "median of the pairs' (the VM's speed drifts by more than a few percent).",
        ),
    ] = 1,
    timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds.")] = 600,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Run M sessions through N simulated agents; check invariants; print the figures."""
    config = SimulationConfig(
        database=database,
        redis_url=redis,
        agents=agents,
        sessions=sessions,
        cluster_size=cluster_size,
        fail_rate=fail_rate,
        seed=seed,
        timeout_s=timeout,
        upload=upload,
        retries=retries,
        retry_delay_s=retry_delay,
        wait_for_kernels_ready=wait_for_kernels_ready,
    )
    progress = None if as_json else (lambda message: _err.print(f"[dim]simulate: {message}[/]"))
    # The manager's warnings go to stderr as the daemons print them; the simulated agents' are
    # the failures `--fail-rate` injects (one line each, hundreds per run), counted in the
    # result's failure causes instead.
    configure_logging("WARNING")
    logging.getLogger("corral.agent").setLevel(logging.ERROR)
    try:
        result = asyncio.run(run_simulation(config, progress))
        if dashboards:
            watched = dataclasses.replace(config, dashboards=dashboards)
            pairs = [with_dashboards(result, asyncio.run(run_simulation(watched, progress)))]
            for _ in range(rounds - 1):
                without = asyncio.run(run_simulation(config, progress))
                pairs.append(
                    with_dashboards(without, asyncio.run(run_simulation(watched, progress)))
                )
            result = median_pair(pairs)
    except SimulationError as exc:
        fail(str(exc), code=1)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for key, value in result.items():
            typer.echo(f"{key:>28}: {value}")
    if result["invariant_violations"]:
        raise typer.Exit(1)


def median_pair(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The pair (`with_dashboards`) of the median loss, with every pair's loss and every
    pair's violations."""
    ranked = sorted(pairs, key=lambda pair: pair["dashboards_throughput_loss_pct"])
    median = ranked[(len(ranked) - 1) // 2]
    return median | {
        "dashboards_throughput_loss_pct_rounds": [
            p["dashboards_throughput_loss_pct"] for p in pairs
        ],
        "invariant_violations": sum(p["invariant_violations"] for p in pairs),
    }


def with_dashboards(without: dict[str, Any], watched: dict[str, Any]) -> dict[str, Any]:
    """The run with dashboards open, with the throughput of the run without and the loss."""
    base = float(without["lifecycle_sessions_per_s"])
    loss = 100 * (base - float(watched["lifecycle_sessions_per_s"])) / base if base else 0.0
    return watched | {
        "lifecycle_sessions_per_s_without_dashboards": base,
        "dashboards_throughput_loss_pct": round(loss, 1),
        "invariant_violations": without["invariant_violations"] + watched["invariant_violations"],
    }
