"""The `corral` command line: one typer app, one module per command group."""

from __future__ import annotations

import typer

from corral._gc import tune_gc
from corral.cli import (
    agent,
    agents_cli,
    bench,
    bench_api,
    db,
    events,
    explain,
    manager,
    run,
    session,
    simulate,
    states,
    up,
)

app = typer.Typer(
    name="corral",
    help="corral — a session orchestrator for AI compute clusters.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("states")(states.states_command)
app.command("explain")(explain.explain_command)
app.command("manager")(manager.manager_command)
app.add_typer(agent.app, name="agent")
agent.app.command("ls")(agents_cli.agent_ls_command)
app.command("run", context_settings=run.CONTEXT_SETTINGS)(run.run_command)
app.add_typer(session.app, name="session")
app.command("events")(events.events_command)
app.command("up")(up.up_command)
app.command("simulate")(simulate.simulate_command)
bench.app.command("api")(bench_api.api_command)
app.add_typer(bench.app, name="bench")
app.add_typer(db.app, name="db")


def main() -> None:
    """Entry point of the `corral` console script."""
    tune_gc()
    app()
