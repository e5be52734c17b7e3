"""`corral bench endings`: its arguments, refused by name before anything runs."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corral.cli.bench import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--path", "hints"], "--path: must be `report` or `tasks`, got 'hints'"),
        (["--running", "10", "--ending", "11"], "--ending: 11 is more than the 10 --running"),
    ],
)
def test_impossible_arguments_are_refused_by_name(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["endings", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
