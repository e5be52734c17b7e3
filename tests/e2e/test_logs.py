"""Logs and events as a user reads them: `corral up`, then `session logs` and `events`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.e2e._ranks import print_then_meet
from tests.e2e._up import Up, start_up

LINE_BYTES = 100  # each line the big job prints, its newline included
BIG_LINES = 500_000  # 50 MB
CAP_BYTES = 10 * 1024 * 1024  # the manager's default cap per kernel and stream
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`corral up` with one local agent, shared by this module's tests."""
    yield from start_up(tmp_path_factory.mktemp("logs"))


def _ended(up: Up, session_id: str, timeout_s: float = 150) -> dict[str, object]:
    """The session once it ended (polled, with a deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        shown = up.corral("session", "info", session_id, "--json")
        assert shown.returncode == 0, shown.stderr
        info: dict[str, object] = json.loads(shown.stdout)
        if info["status"] in ("TERMINATED", "ERROR", "CANCELLED"):
            return info
        assert time.monotonic() < deadline, f"session {session_id} did not end: {info}"
        time.sleep(0.5)


def _line(i: int) -> str:
    return f"line {i:09d} ".ljust(LINE_BYTES - 1, "x")


@pytest.fixture(scope="module")
def big(up: Up) -> str:
    """A finished job that printed 50 MB, 100-byte lines numbered from 0."""
    program = (
        "import sys\n"
        f"w = sys.stdout.write\nfor i in range({BIG_LINES}): "
        f"w(f'line {{i:09d}} '.ljust({LINE_BYTES - 1}, 'x') + '\\n')"
    )
    started = up.corral("run", "--detach", "--name", "big", "--", "python", "-c", program)
    assert started.returncode == 0, started.stderr
    ended = _ended(up, started.stdout.strip())  # `--detach` printed the session's number
    assert ended["status"] == "TERMINATED"
    return str(ended["id"])


def test_a_50_mb_log_keeps_its_newest_part_and_says_what_was_dropped(up: Up, big: str) -> None:
    """The log is capped: the note first, then the newest ~10 MiB, ending with the last line."""
    shown = up.corral("session", "logs", big)
    assert shown.returncode == 0, shown.stderr
    note, *rest = shown.stdout.splitlines(keepends=True)
    assert re.fullmatch(r"\[corral: \d+\.\d MB of earlier output dropped\]\n", note)
    kept = len(shown.stdout) - len(note)
    assert CAP_BYTES <= kept <= CAP_BYTES + 2 * 256 * 1024 + LINE_BYTES  # whole chunks kept
    assert rest[-1] == _line(BIG_LINES - 1) + "\n"
    dropped_mb = float(note.split()[1])
    assert abs(dropped_mb * 1e6 + kept - BIG_LINES * LINE_BYTES) < 0.1e6


def test_tail_prints_the_last_lines_of_a_big_log(up: Up, big: str) -> None:
    """`--tail 5` prints exactly the last five lines."""
    shown = up.corral("session", "logs", big, "--tail", "5")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "".join(_line(i) + "\n" for i in range(BIG_LINES - 5, BIG_LINES))


def test_timestamps_and_since(up: Up, big: str) -> None:
    """`--timestamps` prefixes each line with its time; `--since` keeps what came after."""
    stamped = up.corral("session", "logs", big, "--tail", "2", "--timestamps")
    lines = stamped.stdout.splitlines()
    assert len(lines) == 2
    assert all(STAMP.match(line) for line in lines), lines
    assert lines[-1].endswith(_line(BIG_LINES - 1))
    recent = up.corral("session", "logs", big, "--since", "1h", "--tail", "1")
    assert recent.stdout == _line(BIG_LINES - 1) + "\n"
    future = up.corral("session", "logs", big, "--since", "2999-01-01T00:00:00Z")
    assert (future.returncode, future.stdout) == (0, "")
    bad = up.corral("session", "logs", big, "--since", "yesterday")
    assert bad.returncode == 2
    assert "since" in bad.stderr


def test_a_multi_kernel_session_prefixes_each_line(up: Up) -> None:
    """With several kernels, every line says which kernel printed it; `--kernel` picks one."""
    ranks = print_then_meet("'rank', os.environ['RANK']")
    done = up.corral("run", "--cluster-size", "2", "--", "python", "-c", ranks)
    assert done.returncode == 0, done.stderr
    session = {"id": _newest_id(up)}
    shown = up.corral("session", "logs", session["id"])
    assert sorted(shown.stdout.splitlines()) == ["[kernel 0] rank 0", "[kernel 1] rank 1"]
    one = up.corral("session", "logs", session["id"], "--kernel", "1")
    assert one.stdout == "rank 1\n"  # one kernel's output, as it wrote it


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_rank_that_ends_first_decides_the_result_not_the_main_kernel_it_cut(
    up: Up, exit_code: int
) -> None:
    """Rank 1 ends by itself while rank 0 still runs: the session ends (spec 1's
    DetectTermination), rank 0 is stopped, and rank 1's exit is the run's result."""
    ranks = (
        "import os, sys, time\n"
        f"sys.exit({exit_code}) if os.environ['RANK'] == '1' else time.sleep(300)"
    )
    done = up.corral("run", "--cluster-size", "2", "--", "python", "-c", ranks)
    assert done.returncode == exit_code, done.stderr
    info = json.loads(up.corral("session", "info", _newest_id(up), "--json").stdout)
    assert info["result"] == ("success" if exit_code == 0 else "failure"), info
    assert info["exit_code"] == exit_code
    by_rank = {k["cluster_index"]: k["exit_code"] for k in info["kernels"]}
    assert by_rank[1] == exit_code
    # Stopped (SIGTERM), or, when rank 1 failed before rank 0 started, never run at all.
    assert by_rank[0] in (-15, None)


def _newest_id(up: Up) -> str:
    """The id of the newest session of `up`."""
    listed = json.loads(up.corral("session", "ls", "--all-states", "--json").stdout)
    return str(max(listed, key=lambda s: s["created_at"])["id"])


def test_events_tail_shows_the_newest_last_and_a_session_by_prefix(up: Up, big: str) -> None:
    """`events --tail 3` is the three newest, oldest first; `--session` takes a prefix."""
    last = json.loads(up.corral("events", "--tail", "3", "--json").stdout)
    every = json.loads(up.corral("events", "--since", "0", "--limit", "1000", "--json").stdout)
    assert [e["id"] for e in last] == [e["id"] for e in every[-3:]]
    mine = json.loads(up.corral("events", "--session", big[:13], "--json").stdout)
    assert {e["entity_id"] for e in mine} == {big}
    assert mine[-1]["payload"]["to"] == "TERMINATED"


def test_a_follower_stops_on_sigint_even_when_started_with_it_ignored(up: Up, big: str) -> None:
    """`events -f` ends with 130 on SIGINT, also as a background job that ignores SIGINT."""
    follower = subprocess.Popen(
        [sys.executable, "-m", "corral", "events", "-f", "--json", "--session", big],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=up.env,
        # What a shell does for a script's background job (and so for a suite run that way).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert follower.stdout is not None
        assert json.loads(follower.stdout.readline())["entity_id"] == big  # it is following
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=60) == 130
    finally:
        follower.kill()
        follower.wait()
        if follower.stdout is not None:
            follower.stdout.close()


pytestmark = pytest.mark.timeout(600)
