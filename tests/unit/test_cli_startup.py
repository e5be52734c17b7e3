"""The command line's start-up: the user verbs load the client only, every command still runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from corral.cli import _Commands, app

# The server stack: what a manager or an agent imports, and a user's command must not.
SERVER_MODULES = (
    "sqlalchemy",
    "fastapi",
    "uvicorn",
    "opentelemetry",
    "corral.store.database",
    "corral.manager.daemon",
    "corral.agent.daemon",
    "corral.settings",
)

runner = CliRunner()


def test_the_user_verbs_do_not_import_the_server_stack() -> None:
    """Loading the CLI with `run`, `session` and `events` imports no server module."""
    probe = (
        "import sys, corral.cli, corral.cli.run, corral.cli.session, corral.cli.events; "
        f"print(','.join(m for m in {SERVER_MODULES!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == ""


def test_the_commands_run_against_a_manager_load_the_client_only() -> None:
    """`user`, `token` and `group` talk to a manager: they import no server module either."""
    probe = (
        "import sys, corral.cli.users_cli, corral.cli.tokens_cli, corral.cli.groups_cli; "
        f"print(','.join(m for m in {SERVER_MODULES!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == ""


@pytest.mark.parametrize("name", sorted(_Commands.loaders))
def test_every_command_loaded_on_use_answers_help(name: str) -> None:
    """Each command imported on first use is found, and shows its own help."""
    result = runner.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_the_top_level_help_lists_every_command() -> None:
    """`corral --help` names the eager and the lazily loaded commands alike."""
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for name in ("run", "session", "events", *_Commands.loaders):
        assert name in result.output
