"""`corral bench processes` as a user runs it: a real manager and a real process agent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e._cli import corral


def test_bench_processes_runs_every_job_and_prints_its_figures(tmp_path: Path) -> None:
    """8 jobs of `true` on 2 slots all end; --json gives jobs/s, latency, phases, CPU, CLI time,
    and submit → process start of sessions sent one at a time, over REST and through the CLI
    (from the kernels' own clock: after the send, and not long after)."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral(
        "bench", "processes", "--jobs", "8", "--slots", "2", "--latency", "2", "--cli", "1",
        "--json", env=env, timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["benchmark"] == "processes"
    assert output["jobs"] == output["terminated"] == 8
    assert output["jobs_per_s"] > 0
    latency = output["submit_to_running_ms"]
    assert 0 < latency["p50"] <= latency["p95"]
    assert {"PENDING->SCHEDULED", "CREATING->RUNNING"} <= set(output["phase_p50_ms"])
    cpu = output["cpu_ms_per_job"]
    # /proc counts in clock ticks (10 ms): 8 kernels of `true` may not reach one.
    assert cpu["manager"] > 0 and cpu["agent"] > 0 and cpu["kernels"] >= 0
    assert cpu["total"] == pytest.approx(cpu["manager"] + cpu["agent"] + cpu["kernels"], abs=0.02)
    assert output["cli_call_ms_p50"] > 0
    for how in ("rest", "cli"):
        start = output[f"{how}_submit_to_start_ms"]
        assert 0 < start["p50"] <= start["p95"] < 60_000
    assert output["cli_submit_to_start_ms"]["p50"] > output["cli_call_ms_p50"] / 2
    assert "CREATING->RUNNING" in output["rest_phase_p50_ms"]
    assert output["submit_transport_errors"] >= 0  # counted (issue 35: should be 0 under load)
    assert output["creates_per_s"] > 0


def test_bench_processes_submits_one_job_array_like_sbatch_array(tmp_path: Path) -> None:
    """`--submit array`: the jobs go in as one job array (one request), and all of them end;
    with `--sleep`, jobs of `sleep S` whose makespan is set against the ideal (3 waves of 2
    here: 1.5 s, which no run can beat); an unknown mode is a usage error naming the modes."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral(
        "bench", "processes", "--jobs", "6", "--slots", "2", "--latency", "0", "--cli", "0",
        "--submit", "array", "--sleep", "0.5", "--json", env=env, timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["submit"] == "array"
    assert output["jobs"] == output["terminated"] == 6
    assert output["command"] == "sleep 0.5"
    assert output["ideal_s"] == 1.5 <= output["makespan_s"]
    assert output["submit_transport_errors"] == 0
    assert output["rest_submit_to_start_ms"] is None  # --latency 0: none sent one at a time
    wrong = corral("bench", "processes", "--submit", "bulk", env=env)
    assert wrong.returncode == 2
    assert "each, array" in wrong.stderr
