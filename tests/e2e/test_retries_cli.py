"""`corral run --retries`: a failing command retried by the manager, followed to its end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._up import Up, start_up


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` whose cluster default waits 1 s before a retry (corral.toml)."""
    (tmp_path / "none.toml").write_text("[retry_policy_default]\nretry_delay = 1\n")
    yield from start_up(tmp_path)


def test_run_with_retries_shows_every_attempt_and_exits_with_the_last(
    up: Up, tmp_path: Path
) -> None:
    """Fails once (a marker file), then succeeds: both outputs, the retry said, exit 0."""
    marker = tmp_path / "marker"
    script = f"if [ -e {marker} ]; then echo second; else touch {marker}; echo first; exit 3; fi"
    done = up.corral("run", "--retries", "2", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "first\nsecond\n"
    assert "attempt 2 of 3 after kernel_nonzero_exit, retrying in" in done.stderr
    listed = json.loads(up.corral("session", "ls", "--all-states", "--json").stdout)
    assert sorted((s["retry_count"], s["status"]) for s in listed) == [
        (0, "ERROR"),
        (1, "TERMINATED"),
    ]
    first = min(listed, key=lambda s: s["retry_count"])
    attempts = up.corral("session", "attempts", str(first["number"]), "--json")
    assert attempts.returncode == 0, attempts.stderr
    items = json.loads(attempts.stdout)["items"]
    assert [(a["attempt"], a["status"], a["exit_code"]) for a in items] == [
        (1, "ERROR", 3),
        (2, "TERMINATED", 0),
    ]
    info = up.corral("session", "info", str(first["number"]))
    assert "attempt:" in info.stdout and "1 of 3" in info.stdout
    assert "retried: attempt 2 of 3 is session" in info.stdout


def test_an_always_failing_run_exits_with_its_code_once_retries_are_exhausted(up: Up) -> None:
    """Every attempt fails: three outputs, "retries exhausted", the last attempt's exit code."""
    done = up.corral("run", "--retries", "2", "--", "sh", "-c", "echo try; exit 5")
    assert done.returncode == 5, done.stderr
    assert done.stdout == "try\ntry\ntry\n"
    assert "retries exhausted: attempt 3 of 3 failed" in done.stderr


def test_an_admin_pauses_and_resumes_retries(up: Up) -> None:
    """`corral retries pause` (corral up's user is an admin): every user sees it; resume."""
    paused = up.corral("retries", "pause", "--reason", "registry down", "--json")
    assert paused.returncode == 0, paused.stderr
    assert (json.loads(paused.stdout)["paused"], json.loads(paused.stdout)["reason"]) == (
        True,
        "registry down",
    )
    status = up.corral("retries", "status")
    assert "paused (registry down)" in status.stdout
    resumed = up.corral("retries", "resume", "--json")
    assert json.loads(resumed.stdout)["paused"] is False
