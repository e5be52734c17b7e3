"""`corral bench api` end to end: a real manager, a load generator process, real HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The command as `corral bench` will register it; run on its own until it is registered.
_RUN_COMMAND = "import typer; from corral.cli.bench_api import api_command; typer.run(api_command)"


def test_bench_api_creates_and_reads_every_session_without_errors(tmp_path: Path) -> None:
    """20 sessions created over HTTP, 50 GETs of them, figures in one JSON object, no errors."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    args = ["--sessions", "20", "--concurrency", "4", "--get-rate", "100", "--get-duration", "0.5"]
    result = subprocess.run(
        [sys.executable, "-c", _RUN_COMMAND, *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode == 1 and "POST /v1/sessions answered 404" in result.stderr:
        pytest.skip("the manager has no POST /v1/sessions route yet: " + result.stderr.strip())
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["benchmark"] == "api"
    assert (output["backend"], output["agents"]) == ("sqlite", 1)
    assert output["sessions"] == output["created"] == 20
    assert output["get_requests"] == 50
    assert output["errors"] == 0, output["error_samples"]
    assert output["create_per_s"] > 0
    assert 0 < output["get_p50_ms"] <= output["get_p99_ms"] <= output["get_max_ms"]
    assert output["settle_s"] >= 2.0  # the read phase waited for a quiet coordinator
