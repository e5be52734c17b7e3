"""Results, dependency chains and time limits as a user meets them: `corral up`, `corral run`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e._up import Up, start_up

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """One `corral up` for the module's chains (each test names its own sessions)."""
    yield from start_up(tmp_path_factory.mktemp("deps"))


def _detach(up: Up, *args: str) -> str:
    """Submit without following; the session's id."""
    done = up.corral("run", "--detach", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _info(up: Up, ref: str) -> dict[str, Any]:
    done = up.corral("session", "info", "--json", ref)
    assert done.returncode == 0, done.stderr
    info: dict[str, Any] = json.loads(done.stdout)
    return info


def _until(up: Up, ref: str, statuses: set[str]) -> dict[str, Any]:
    """Poll the session until its status is one of `statuses` (or fail at the deadline)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        info = _info(up, ref)
        if info["status"] in statuses or time.monotonic() > deadline:
            assert info["status"] in statuses, info
            return info
        time.sleep(0.2)


def test_after_a_success_the_dependant_runs(up: Up) -> None:
    """A (named) succeeds → `corral run --after A` runs, prints its output and exits 0."""
    _detach(up, "--name", "ok-first", "--", "python", "-c", "import time; time.sleep(1)")
    done = up.corral("run", "--after", "ok-first", "--", "python", "-c", "print('second')")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "second\n"
    assert _info(up, "ok-first")["result"] == "success"


def test_after_a_failure_an_afterok_dependant_is_cancelled(up: Up) -> None:
    """A fails → B (afterok) is CANCELLED naming A, and `corral run` exits non-zero."""
    a = _detach(up, "--", "python", "-c", "import sys; sys.exit(3)")
    done = up.corral("run", "--after", a, "--", "python", "-c", "print('never')")
    assert done.returncode != 0
    assert done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert "CANCELLED (cancelled)" in last and f"session {a[:8]} (afterok)" in last, last


def test_afterany_runs_after_a_failure(up: Up) -> None:
    """`--after afterany:A` runs once A ended, although A failed."""
    a = _detach(up, "--", "python", "-c", "import sys; sys.exit(3)")
    done = up.corral("run", "--after", f"afterany:{a}", "--", "python", "-c", "print('any')")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "any\n"


def test_afternotok_runs_after_a_failure_and_is_cancelled_after_a_success(up: Up) -> None:
    """Slurm's `--dependency afternotok:A`: runs when A failed, is cancelled when A succeeded."""
    failed = _detach(up, "--", "python", "-c", "import sys; sys.exit(3)")
    ok = _detach(up, "--", "python", "-c", "print(1)")
    handler = up.corral(
        "run", "--dependency", f"afternotok:{failed}", "--", "python", "-c", "print('handled')"
    )
    assert handler.returncode == 0, handler.stderr
    assert handler.stdout == "handled\n"
    unneeded = _detach(up, "--dependency", f"afternotok:{ok}", "--", "python", "-c", "print(0)")
    ended = _until(up, unneeded, {"CANCELLED", "TERMINATED", "ERROR"})
    assert ended["status"] == "CANCELLED"
    assert f"session {ok[:8]} (afternotok)" in ended["status_info"]


def test_a_bad_dependency_is_a_usage_error(up: Up) -> None:
    """An unknown kind exits 2 naming it; a session that does not exist is refused."""
    bad = up.corral("run", "--dependency", "singleton:1", "--", "true")
    assert bad.returncode == 2
    assert "unknown dependency kind 'singleton'" in bad.stderr
    missing = up.corral("run", "--after", "no-such-session", "--", "true")
    assert missing.returncode != 0
    assert "no-such-session" in missing.stderr


def test_a_running_session_terminated_by_its_user_ends_cancelled(up: Up) -> None:
    """`session terminate` of a running job: result cancelled; its `corral run` exits non-zero."""
    follower = subprocess.Popen(
        [sys.executable, "-m", "corral", "run", "--name", "to-cancel", "--", "sleep", "60"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=up.env,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while up.corral("session", "info", "--json", "to-cancel").returncode != 0:
            assert time.monotonic() < deadline, "the session never appeared"
            time.sleep(0.2)
        _until(up, "to-cancel", {"RUNNING"})
        assert up.corral("session", "terminate", "to-cancel").returncode == 0
        _, stderr = follower.communicate(timeout=DEADLINE_S)
    finally:
        follower.kill()
        follower.wait()
    assert follower.returncode != 0, stderr
    info = _info(up, "to-cancel")
    assert (info["status"], info["result"], info["failure_cause"]) == (
        "TERMINATED",
        "cancelled",
        "user_cancelled",
    )
    shown = up.corral("session", "info", "to-cancel")
    assert "cancelled" in shown.stdout
    assert "(cancelled)" in stderr.splitlines()[-1]


def test_a_job_past_its_time_limit_ends_timeout(up: Up) -> None:
    """`corral run --time 2s -- sleep 60` is stopped after about 2 s: result timeout, exit != 0."""
    started = time.monotonic()
    done = up.corral("run", "--name", "too-long", "--time", "2s", "--", "sleep", "60")
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert elapsed < 30, f"took {elapsed:.1f} s"
    assert "TERMINATED (timeout): time_limit" in done.stderr.splitlines()[-1], done.stderr
    info = _info(up, "too-long")
    assert (info["result"], info["failure_cause"], info["time_limit_s"]) == (
        "timeout",
        "time_limit",
        2,
    )
    shown = up.corral("session", "info", "too-long").stdout
    assert "limit:" in shown and "2s" in shown


def test_a_limit_is_shown_with_the_time_left_while_it_runs(up: Up) -> None:
    """`session info` of a running limited job shows the limit and the time left."""
    sid = _detach(up, "--time", "1:00:00", "--", "sleep", "600")
    _until(up, sid, {"RUNNING"})
    shown = up.corral("session", "info", sid).stdout
    assert "1h (59m" in shown, shown
    assert up.corral("session", "terminate", sid).returncode == 0
