"""The `corral` command line: one typer app, one module per command group.

`run` is registered as is; every other command is imported when it runs (`_lazy.py`), and
the user verbs (`run`, `session`, `events`) import only the client, so a user's command starts
in a fraction of the time.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from corral import package_version
from corral._gc import tune_gc
from corral.cli import _coercion, _lazy, _startup, run  # noqa: F401 (_startup: before httpx)
from corral.cli._common import DEBUG_VARIABLE, FAILURE_EXIT, INTERRUPTED_EXIT
from corral.cli._usage import is_help_shown, usage_message

_coercion.install()


def _agent_commands(app: typer.Typer) -> None:
    from corral.cli import agents_cli

    app.command("ls")(agents_cli.agent_ls_command)
    app.command("drain")(agents_cli.agent_drain_command)
    app.command("undrain")(agents_cli.agent_undrain_command)
    app.command("rm")(agents_cli.agent_rm_command)


def _bench_commands(app: typer.Typer) -> None:
    from corral.cli.bench_api import api_command

    app.command("api")(api_command)
    from corral.cli.bench_proxy import proxy_command

    app.command("proxy")(proxy_command)


class _Commands(_lazy.LazyGroup):
    loaders = {  # noqa: RUF012 (the class attribute of LazyGroup, set once)
        "session": _lazy.group("session", "corral.cli.session"),
        "events": _lazy.command("events", "corral.cli.events", "events_command"),
        "states": _lazy.command("states", "corral.cli.states", "states_command"),
        "manager": _lazy.command("manager", "corral.cli.manager", "manager_command"),
        "agent": _lazy.group("agent", "corral.cli.agent", _agent_commands),
        "up": _lazy.command("up", "corral.cli.up", "up_command"),
        "submit": _lazy.command("submit", "corral.cli.submit", "submit_command"),
        "simulate": _lazy.command("simulate", "corral.cli.simulate", "simulate_command"),
        "chaos": _lazy.command("chaos", "corral.cli.chaos", "chaos_command"),
        "bench": _lazy.group("bench", "corral.cli.bench", _bench_commands),
        "db": _lazy.group("db", "corral.cli.db"),
        "retries": _lazy.group("retries", "corral.cli.retries"),
        "admin": _lazy.group("admin", "corral.cli.admin"),
        "user": _lazy.group("user", "corral.cli.users_cli"),
        "token": _lazy.group("token", "corral.cli.tokens_cli"),
        "group": _lazy.group("group", "corral.cli.groups_cli"),
        "deploy": _lazy.group("deploy", "corral.cli.deploy"),
        "proxy": _lazy.command("proxy", "corral.cli.proxy", "proxy_command"),
    }


app = typer.Typer(
    name="corral",
    help="corral — a session orchestrator for AI compute clusters.",
    no_args_is_help=True,
    add_completion=False,
    cls=_Commands,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"corral {package_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print corral's version and exit.",
        ),
    ] = False,
) -> None:
    """corral — a session orchestrator for AI compute clusters."""


@app.command("version")
def version_command() -> None:
    """Print corral's version."""
    _print_version(True)


app.command("run", context_settings=run.CONTEXT_SETTINGS)(run.run_command)


def main() -> None:
    """Entry point of the `corral` console script: errors end as one `corral: error:` line.

    Exit codes: 2 for usage errors (a bad flag or value), 1 for other failures, 130 on Ctrl-C.
    An error nothing expected (a bug, or a server answering what corral does not) is one line
    too, with a hint: `CORRAL_DEBUG=1` shows its traceback.
    """
    tune_gc(collect=False)
    try:
        # Not standalone: click's errors come here instead of typer's boxed panels.
        code = app(prog_name="corral", standalone_mode=False)
    except typer.TyperException as exc:
        if not is_help_shown(exc):
            typer.echo(f"corral: error: {usage_message(exc)}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("corral: error: aborted", err=True)
        sys.exit(FAILURE_EXIT)
    except KeyboardInterrupt:
        typer.echo("corral: error: interrupted", err=True)
        sys.exit(INTERRUPTED_EXIT)
    except Exception as exc:
        if os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            # typer's hook would print the traceback boxed: the plain one, as Python prints it.
            sys.excepthook = sys.__excepthook__
            raise
        typer.echo(f"corral: error: {unexpected_message(exc)}", err=True)
        typer.echo(f"corral: run it again with {DEBUG_VARIABLE}=1 to see where", err=True)
        sys.exit(FAILURE_EXIT)
    sys.exit(code if isinstance(code, int) else 0)


def unexpected_message(exc: BaseException) -> str:
    """An unexpected error in a line: its type and message (the type alone if it has none)."""
    said = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
