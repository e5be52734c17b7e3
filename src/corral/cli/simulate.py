"""`corral simulate`: a manager and simulated agents running sessions end to end (JSON)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated

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
    )
    progress = None if as_json else (lambda message: _err.print(f"[dim]simulate: {message}[/]"))
    # The manager's warnings go to stderr as the daemons print them; the simulated agents' are
    # the failures `--fail-rate` injects (one line each, hundreds per run), counted in the
    # result's failure causes instead.
    configure_logging("WARNING")
    logging.getLogger("corral.agent").setLevel(logging.ERROR)
    try:
        result = asyncio.run(run_simulation(config, progress))
    except SimulationError as exc:
        fail(str(exc), code=1)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for key, value in result.items():
            typer.echo(f"{key:>28}: {value}")
    if result["invariant_violations"]:
        raise typer.Exit(1)
