"""`corral bench`: progress lines name where a run goes, never the database's password."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import corral.cli.bench as bench_cli

runner = CliRunner()
URL = "postgresql://corral:hunter2@db.example:5432/corral"


class _Figures(dict[str, Any]):
    """Whatever a result line asks for."""

    def __missing__(self, key: str) -> int:
        return 0


class _Result:
    def as_json(self) -> dict[str, Any]:
        return _Figures()


async def _ran(*_args: Any, **_kwargs: Any) -> _Result:
    return _Result()


@pytest.mark.parametrize(
    ("command", "runner_name"),
    [
        ("store", "run_store_bench"),
        ("schedule", "run_schedule_bench"),
        ("endings", "run_endings_bench"),
    ],
)
def test_progress_shows_the_server_without_credentials(
    monkeypatch: pytest.MonkeyPatch, command: str, runner_name: str
) -> None:
    monkeypatch.setattr(bench_cli, runner_name, _ran)
    result = runner.invoke(bench_cli.app, [command, "--database", URL], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    shown = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "db.example:5432/corral" in shown
    assert "hunter2" not in shown
