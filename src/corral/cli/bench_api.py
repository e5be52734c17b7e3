"""`corral bench api`: session creates/s and GET latency over HTTP against a real manager."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console

from corral.bench.api import ApiBenchError, ApiLoad, run_api_bench
from corral.cli._common import fail, fail_unreachable, without_credentials

_err = Console(stderr=True)


def api_command(
    database: Annotated[
        str,
        typer.Option(
            "--database",
            help="`sqlite` (a temporary file: the embedded defaults) or a postgresql:// URL "
            "whose server gets a scratch database.",
        ),
    ] = "sqlite",
    sessions: Annotated[int, typer.Option(min=1, help="Sessions to create (1 cpu each).")] = 2000,
    agents: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Silent agents of 64 cpu (they never answer, so placed sessions wait in "
            "PREPARING). Default: room for every session; 0: every session stays PENDING.",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(min=1, max=1024, help="Create requests in flight at once.")
    ] = 32,
    get_rate: Annotated[
        float, typer.Option("--get-rate", min=1, help="GET requests per second.")
    ] = 200.0,
    get_duration_s: Annotated[
        float,
        typer.Option("--get-duration", min=0.1, help="Seconds of GET requests at --get-rate."),
    ] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Creates/s and GET latency of `/v1/sessions` over HTTP, against a real manager."""
    load = ApiLoad(
        sessions=sessions,
        concurrency=concurrency,
        get_rate_per_s=get_rate,
        get_duration_s=get_duration_s,
    )

    def progress(line: str) -> None:
        if _err.is_terminal:
            _err.print(f"[dim]bench api: {line}[/]")

    if not as_json:
        _err.print(f"[dim]bench api: {sessions} sessions on {without_credentials(database)} ...[/]")
    try:
        result = asyncio.run(
            run_api_bench(database, load, agents=agents, progress=progress)
        ).as_json()
    except ApiBenchError as exc:
        fail(str(exc), code=1)
    except OSError as exc:
        fail_unreachable(exc)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(
            f"{result['backend']}, {result['agents']} agents: created {result['created']}/"
            f"{result['sessions']} in {result['create_s']} s = {result['create_per_s']}/s "
            f"(p50 {result['create_p50_ms']} ms, p99 {result['create_p99_ms']} ms, "
            f"{result['concurrency']} in flight)"
        )
        typer.echo(
            f"  GET at {result['get_rate_per_s']:g}/s: p50 {result['get_p50_ms']} ms, "
            f"p99 {result['get_p99_ms']} ms, max {result['get_max_ms']} ms "
            f"over {result['get_requests']} requests"
        )
    errors = result["errors"]
    if errors:
        samples = result["error_samples"]
        assert isinstance(samples, list)
        fail(f"{errors} requests failed: {result['errors_by_kind']}; first: {samples[0]}", code=1)
