"""The CLI commands on a test app, talking to an in-memory API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from corral.cli import _plain, _remote, agents_cli, events, run, session
from tests.unit.client._fake_api import FakeApi


def cli_app() -> typer.Typer:
    """The commands registered exactly as `corral.cli` is told to register them."""
    app = typer.Typer()
    app.add_typer(session.app, name="session")
    app.command("events")(events.events_command)
    app.command("run", context_settings=run.CONTEXT_SETTINGS)(run.run_command)
    agent = typer.Typer()
    agent.command("ls")(agents_cli.agent_ls_command)
    app.add_typer(agent, name="agent")
    return app


class Cli:
    """Runs `corral ...` command lines in-process against the fake API."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.app = cli_app()
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return self.runner.invoke(self.app, list(args), input=input, catch_exceptions=False)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    """The fake API every command's client talks to (no real configuration is read)."""
    fake = FakeApi()
    monkeypatch.setattr(_remote, "connect", fake.client)
    monkeypatch.setattr(_plain, "plain_call", fake.plain_call)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    yield fake


@pytest.fixture
def cli(api: FakeApi) -> Cli:
    """The command line on the fake API."""
    return Cli(api)
