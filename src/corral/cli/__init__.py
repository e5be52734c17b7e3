"""The `corral` command line: one typer app, one module per command group.

The user verbs (`run`, `session`, `events`) talk to a manager through the client only; every
other command is imported when it runs (`_lazy.py`), so a user's command starts in a fraction
of the time.
"""

from __future__ import annotations

import typer

from corral._gc import tune_gc
from corral.cli import _lazy, events, run, session


def _agent_commands(app: typer.Typer) -> None:
    from corral.cli.agents_cli import agent_ls_command

    app.command("ls")(agent_ls_command)


def _bench_commands(app: typer.Typer) -> None:
    from corral.cli.bench_api import api_command

    app.command("api")(api_command)


class _Commands(_lazy.LazyGroup):
    loaders = {  # noqa: RUF012 (the class attribute of LazyGroup, set once)
        "states": _lazy.command("states", "corral.cli.states", "states_command"),
        "manager": _lazy.command("manager", "corral.cli.manager", "manager_command"),
        "agent": _lazy.group("agent", "corral.cli.agent", _agent_commands),
        "up": _lazy.command("up", "corral.cli.up", "up_command"),
        "simulate": _lazy.command("simulate", "corral.cli.simulate", "simulate_command"),
        "bench": _lazy.group("bench", "corral.cli.bench", _bench_commands),
        "db": _lazy.group("db", "corral.cli.db"),
    }


app = typer.Typer(
    name="corral",
    help="corral — a session orchestrator for AI compute clusters.",
    no_args_is_help=True,
    add_completion=False,
    cls=_Commands,
)
app.command("run", context_settings=run.CONTEXT_SETTINGS)(run.run_command)
app.add_typer(session.app, name="session")
app.command("events")(events.events_command)


def main() -> None:
    """Entry point of the `corral` console script."""
    tune_gc()
    app()
