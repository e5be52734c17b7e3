"""`corral states`: the lifecycle tables (placeholder until the states command lands)."""

from __future__ import annotations

import typer


def states_command(mermaid: bool = typer.Option(False, help="Print Mermaid diagrams.")) -> None:
    """Print each lifecycle's transition table."""
    raise typer.Exit(1)
