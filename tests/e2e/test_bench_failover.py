"""`corral bench failover` end to end: `corral up` in the bench's process, a deployment of real
replica processes, one made to fail its health checks, requests through the real proxy."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e._cli import corral


def test_bench_failover_times_a_sick_replica_out_of_rotation(tmp_path: Path) -> None:
    """One round: the sick replica stops getting requests (it still answers them: only its
    health checks fail), the time is reported with the issue's bound; figures, not asserted."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral(
        "bench", "failover", "--rounds", "1", "--interval", "0.5", env=env, timeout_s=180
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["benchmark"] == "failover"
    assert (output["replicas"], output["failure_threshold"], output["rounds"]) == (2, 3, 1)
    assert output["bound_s"] == 2.5  # failure_threshold x interval_s + 1 s
    (took,) = output["out_of_rotation_s"]
    assert took > 0 and output["max_s"] == took
    assert isinstance(output["within_bound"], bool)
