"""`corral bench latency` as a user runs it: a subprocess on the embedded defaults."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e._cli import corral


def test_bench_latency_prints_the_figures_of_every_session_it_got_running(tmp_path: Path) -> None:
    """All 20 sessions reach RUNNING, and --json prints one object with the latency figures."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral("bench", "latency", "--sessions", "20", "--json", env=env, timeout_s=60)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["benchmark"] == "latency"
    assert output["backend"] == "sqlite"
    assert output["sessions"] == output["running"] == 20
    for figure in ("p50_ms", "p99_ms", "max_ms", "elapsed_s"):
        assert isinstance(output[figure], float) and output[figure] > 0, figure
    assert output["p50_ms"] <= output["p99_ms"] <= output["max_ms"]
    assert output["hops_ms"]["CREATING->RUNNING"]["n"] == 20
