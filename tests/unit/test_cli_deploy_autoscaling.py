"""`corral deploy create` refuses a bad autoscaling policy or drain grace before any request,
naming the field."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corral.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--min-replicas", "3", "--max-replicas", "2"], "autoscaling.max_replicas: must be"),
        (["--max-replicas", "2", "--target-inflight", "0"], "autoscaling.target_inflight"),
        (["--min-replicas", "2"], "autoscaling.max_replicas: is required"),
        (["--replicas", "5", "--max-replicas", "2"], "replicas: must be within"),
        (["--drain-grace", "-1"], "drain_grace_s"),
    ],
)
def test_bad_flags_are_refused_naming_the_field(flags: list[str], said: str) -> None:
    result = runner.invoke(
        app,
        ["deploy", "create", "llm", *flags, "--", "python", "server.py"],
        env={"CORRAL_URL": "http://127.0.0.1:9"},  # never reached
    )
    assert result.exit_code == 2, result.output
    assert said in result.output
