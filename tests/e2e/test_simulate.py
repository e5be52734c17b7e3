"""`corral simulate` as a user runs it: simulated agents, sessions end to end, invariants."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e._cli import corral


def _simulate(tmp_path: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral("simulate", *args, "--json", env=env, timeout_s=120)
    assert result.returncode == 0, result.stderr
    # The failures a fault rate injects are counted in the output, not logged one by one.
    assert "kernel.stage_failed" not in result.stderr
    output = json.loads(result.stdout)
    assert isinstance(output, dict)
    return output


def test_every_session_ends_and_no_invariant_breaks(tmp_path: Path) -> None:
    """20 agents, 200 sessions: all terminal and successful, nothing over capacity or leaked."""
    output = _simulate(tmp_path, "--agents", "20", "--sessions", "200")
    assert output["terminal"] == output["sessions"] == 200
    assert output["by_status"] == {"TERMINATED": 200}
    assert output["invariant_violations"] == 0
    assert output["reports"] == 200 * 5  # PULLING, PREPARED, RUNNING, TERMINATING, TERMINATED
    assert isinstance(output["lifecycle_sessions_per_s"], float)
    assert output["lifecycle_sessions_per_s"] > 0


@pytest.mark.parametrize("cluster_size", [1, 3])
def test_failures_end_in_error_with_their_causes(tmp_path: Path, cluster_size: int) -> None:
    """With a 30 % fault rate some sessions end in ERROR, each with a cause; still no violation."""
    output = _simulate(
        tmp_path,
        "--agents", "10",
        "--sessions", "100",
        "--cluster-size", str(cluster_size),
        "--fail-rate", "0.3",
        "--seed", "7",
    )  # fmt: skip
    assert output["terminal"] == 100
    assert output["invariant_violations"] == 0, output["violation_examples"]
    by_status = output["by_status"]
    assert isinstance(by_status, dict)
    assert by_status.get("ERROR", 0) > 0
    assert by_status.get("ERROR", 0) + by_status.get("TERMINATED", 0) == 100
    causes = output["failure_causes"]
    assert isinstance(causes, dict)
    assert sum(causes.values()) == by_status["ERROR"]
    assert set(causes) <= {
        "image_pull_failure",
        "kernel_start_failure",
        "kernel_nonzero_exit",
        "oom_killed",
    }


@pytest.mark.redis
def test_with_redis_buses_every_session_ends(tmp_path: Path, redis_url: str) -> None:
    """Hints, locks and events on Redis, with more agents registering at once than redis-py's
    default pool has connections (it refused the 101st, and the loops died on that)."""
    output = _simulate(
        tmp_path, "--agents", "300", "--sessions", "600", "--redis", redis_url
    )  # fmt: skip
    assert output["backend"] == "sqlite+redis"
    assert output["terminal"] == 600
    assert output["by_status"] == {"TERMINATED": 600}
    assert output["invariant_violations"] == 0


def test_sessions_with_an_upload_fetch_and_unpack_it_over_the_agents_link(tmp_path: Path) -> None:
    """`--upload DIR`: every kernel fetches the directory through simulate's in-process link
    to the manager and unpacks it before it starts: all sessions succeed, none fails with
    upload_failure."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "data" / "input.csv").write_text("a,b\n")
    output = _simulate(
        tmp_path, "--agents", "2", "--sessions", "20", "--upload", str(project)
    )  # fmt: skip
    assert output["by_status"] == {"TERMINATED": 20}, output.get("failure_causes")
    assert output["invariant_violations"] == 0


def test_with_retries_every_failed_session_is_retried_once_per_attempt(tmp_path: Path) -> None:
    """`--retries 2` at a 30 % fault rate: every failure retried or exhausted, no duplicate."""
    output = _simulate(
        tmp_path, "--agents", "10", "--sessions", "100", "--fail-rate", "0.3", "--seed", "7",
        "--retries", "2",
    )  # fmt: skip
    assert output["invariant_violations"] == 0, output["violation_examples"]
    by_status = output["by_status"]
    decisions = output["retry_decisions"]
    assert isinstance(by_status, dict) and isinstance(decisions, dict)
    retried = decisions.get("scheduled", 0)
    assert retried > 0
    # Each chain ends once: in success, or exhausted after its third attempt; a session is a
    # first attempt or the retry of one failure.
    assert decisions.get("succeeded", 0) + decisions.get("exhausted", 0) == 100
    assert output["sessions_total"] == output["terminal"] == 100 + retried
    assert by_status.get("ERROR", 0) == retried + decisions.get("exhausted", 0)


def test_dashboards_open_on_the_manager_are_counted_and_compared(tmp_path: Path) -> None:
    """`--dashboards 3 --rounds 2` runs twice without, then with 3 dashboards signed in and
    following the live stream; the pair of the median loss is reported with both pairs'
    losses, every session still ends."""
    output = _simulate(
        tmp_path, "--agents", "5", "--sessions", "60", "--dashboards", "3", "--rounds", "2"
    )
    assert output["terminal"] == 60
    assert output["invariant_violations"] == 0
    assert output["dashboards"] == 3
    events = output["dashboard_events"]
    assert isinstance(events, int) and events > 0  # each saw the sessions' events
    with_them = output["lifecycle_sessions_per_s"]
    without = output["lifecycle_sessions_per_s_without_dashboards"]
    assert isinstance(with_them, float) and isinstance(without, float)
    loss = output["dashboards_throughput_loss_pct"]
    assert loss == round(100 * (without - with_them) / without, 1)
    losses = output["dashboards_throughput_loss_pct_rounds"]
    assert isinstance(losses, list) and len(losses) == 2 and loss == min(losses)
