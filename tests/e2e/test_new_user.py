"""As a new user: a clean HOME, `corral up` in the background, then `corral run` and friends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._ranks import print_then_meet
from tests.e2e._up import Up, start_up


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


def test_run_prints_the_output_untouched_and_returns_the_exit_code(up: Up) -> None:
    """stdout is exactly the command's; progress goes to stderr; the exit code is the job's."""
    done = up.corral("run", "--", "python", "-c", "print(42)")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "42\n"
    assert "RUNNING" in done.stderr
    failed = up.corral("run", "--", "python", "-c", "import sys; print('bye'); sys.exit(3)")
    assert failed.returncode == 3, failed.stderr
    assert failed.stdout == "bye\n"
    listed = up.corral("session", "ls", "--all-states", "--json")
    assert listed.returncode == 0, listed.stderr
    sessions = json.loads(listed.stdout)
    assert sorted(s["status"] for s in sessions) == ["ERROR", "TERMINATED"]


def test_events_follow_shows_a_sessions_status_changes(up: Up) -> None:
    """`corral events -f --json` streams the status changes of a session as they happen."""
    follower = subprocess.Popen(
        # From the first event on: the follower starts alongside `corral run`, and a session
        # can be SCHEDULED before the follower's stream is open.
        [sys.executable, "-m", "corral", "events", "-f", "--json", "--since", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=up.env,
    )
    try:
        done = up.corral("run", "--", "python", "-c", "print('x')")
        assert done.returncode == 0, done.stderr
        assert follower.stdout is not None
        statuses = []
        for line in follower.stdout:
            event = json.loads(line)
            if event.get("kind") == "session.status_changed":
                statuses.append(event["payload"]["to"])
            if "TERMINATED" in statuses:
                break
        assert statuses[:2] == ["SCHEDULED", "PREPARING"]
        assert "RUNNING" in statuses
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=30)
        for pipe in (follower.stdout, follower.stderr):
            if pipe is not None:
                pipe.close()


def test_multi_node_run_on_two_local_agents(tmp_path: Path) -> None:
    """`corral up --agents 2`, then a 2-kernel multi-node run: each rank prints its own line."""
    for up in start_up(tmp_path, "--agents", "2"):
        ranks = print_then_meet("os.environ['RANK'], os.environ['WORLD_SIZE']")
        done = up.corral(
            "run", "--cluster-size", "2", "--multi-node", "--", "python", "-c", ranks
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout == "0 2\n"  # the main kernel's output
        listed = json.loads(up.corral("session", "ls", "--all-states", "--json").stdout)
        (session,) = listed
        info = json.loads(up.corral("session", "info", session["id"], "--json").stdout)
        assert len({k["agent_id"] for k in info["kernels"]}) == 2


pytestmark = pytest.mark.timeout(180)
