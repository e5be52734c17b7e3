"""The command line's start-up: the user verbs load the client only, every command still runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import _Commands, app

# The server stack: what a manager or an agent imports, and a user's command must not.
SERVER_MODULES = (
    "sqlalchemy",
    "fastapi",
    "uvicorn",
    "opentelemetry",
    "numpy",
    "alembic",
    "corral.agent",
    "corral.manager",
    "corral.bench",
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


# Not server modules, but what a command that prints no table never needs: rich (tables only)
# and httpx's own command line (click, rich and pygments, imported with httpx unless barred).
UNUSED_BY_RUN = ("rich", "httpx._main", "click", "pygments")
# What `run --detach` and `session ls` leave to the commands that follow a session: the SDK's
# async client, its models, the spec's models, the event loop and httpx (they send plain
# requests over `http.client`, `cli._plain`), and pydantic (typer checks plain flags without
# it: `cli._coercion`).
UNUSED_BY_RUN_DETACH = (
    "httpx",
    "httpcore",
    "pydantic",
    "pydantic_core",
    "asyncio",
    "corral.client._client",
    "corral.client.models",
    "corral.domain.spec",
    "corral.domain.retry.policy",
    "corral.cli.events",
)

# Runs a command line (argv[2:]) as the console script does, against a port nothing listens on,
# and writes every module the process imported (None: barred) by its exit into argv[1].
PROBE = """
import atexit, sys
out = sys.argv[1]
names = lambda: "\\n".join(m for m, module in sys.modules.items() if module)
atexit.register(lambda: open(out, "w").write(names()))
sys.argv = ["corral", *sys.argv[2:]]
from corral.cli import main
main()
"""


@pytest.mark.parametrize(
    ("args", "unused"),
    [
        (("run", "--detach", "--", "true"), (*UNUSED_BY_RUN, *UNUSED_BY_RUN_DETACH)),
        (("session", "ls"), (*UNUSED_BY_RUN, *UNUSED_BY_RUN_DETACH)),
    ],
)
def test_the_quick_verbs_import_neither_the_server_stack_nor_the_sdk(
    tmp_path: Path, args: tuple[str, ...], unused: tuple[str, ...]
) -> None:
    """`corral run --detach` and `corral session ls` through their requests: no server
    module, no pydantic, neither the SDK's async client nor its models, no asyncio, no rich,
    no httpx (no proxy is configured: with one, the request goes through httpx)."""
    listing = tmp_path / "modules.txt"
    env = {
        **{k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        "CORRAL_URL": "http://127.0.0.1:9",  # discard port: nothing answers, the call fails
        "CORRAL_TOKEN": "crl_test",
        "XDG_CONFIG_HOME": str(tmp_path),
    }
    ended = subprocess.run(
        [sys.executable, "-c", PROBE, str(listing), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert ended.returncode == 1, ended.stderr  # it got as far as the request
    assert "cannot reach" in ended.stderr or "127.0.0.1:9" in ended.stderr, ended.stderr
    loaded = set(listing.read_text().split())
    assert "http.client" in loaded  # the probe saw the request's imports
    unwanted = (*SERVER_MODULES, *unused)
    assert sorted(m for m in loaded if m.startswith(tuple(f"{u}." for u in unwanted))) == []
    assert sorted(loaded.intersection(unwanted)) == []


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
