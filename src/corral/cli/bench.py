"""`corral bench`: performance harnesses with JSON output."""

from __future__ import annotations

import typer

app = typer.Typer(help="Performance benchmarks (JSON output).", no_args_is_help=True)
