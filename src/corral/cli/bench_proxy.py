"""`corral bench proxy`: the serving proxy's overhead against a trivial replica (JSON)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from corral.bench.proxy import run_proxy_bench


def proxy_command(
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="Concurrent connections.")] = 64,
    duration: Annotated[float, typer.Option(min=0.5, help="Seconds of load per target.")] = 5.0,
) -> None:
    """Requests/s and p50/p99 latency direct and through the proxy, in the same run."""
    typer.echo(json.dumps(run_proxy_bench(concurrency, duration), indent=2))
