"""Job arrays as a user runs them: `corral run --array` on `corral up`, the CLI as processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e._up import Up, start_up


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


def _most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The largest number of intervals open at one moment (one ending as another starts: 1)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = most = 0
    for _, change in edges:
        open_now += change
        most = max(most, open_now)
    return most


def test_a_throttled_array_runs_every_element_never_more_than_the_throttle_at_once(
    up: Up, tmp_path: Path
) -> None:
    """100 elements with %5: each runs once and sees its CORRAL_ARRAY_INDEX and the array's
    CORRAL_ARRAY_ID; the server's records (each element's RUNNING interval, from started_at
    to terminated_at) never overlap more than 5 deep."""
    seen = tmp_path / "seen"
    seen.mkdir()
    script = (
        "import os; "
        f"open(os.path.join({str(seen)!r}, os.environ['CORRAL_ARRAY_INDEX']), 'w')"
        ".write(os.environ['CORRAL_ARRAY_ID'])"
    )
    done = up.corral(
        "run", "--array", "0-99%5", "--cpu", "0.1", "--mem", "32m", "--wait",
        "--", "python", "-c", script,
        timeout_s=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    array_id = done.stdout.strip()
    assert "100 sessions, at most 5 at once" in done.stderr
    assert sorted(int(p.name) for p in seen.iterdir()) == list(range(100))
    assert {p.read_text() for p in seen.iterdir()} == {array_id}

    listed = up.corral("session", "ls", "--array", array_id, "--json")
    assert listed.returncode == 0, listed.stderr
    elements = json.loads(listed.stdout)
    assert sorted(e["array_index"] for e in elements) == list(range(100))
    assert {(e["status"], e["exit_code"]) for e in elements} == {("TERMINATED", 0)}
    intervals = [
        (datetime.fromisoformat(e["started_at"]), datetime.fromisoformat(e["terminated_at"]))
        for e in elements
    ]
    assert 1 <= _most_at_once(intervals) <= 5


def test_an_array_detaches_and_is_terminated_as_a_whole_by_its_id(up: Up) -> None:
    """Without --wait the array id is printed and the command returns; `session terminate`
    with that id ends every element; bad syntax is a usage error naming --array's field."""
    bad = up.corral("run", "--array", "0-5:0", "--", "python", "-c", "pass")
    assert bad.returncode == 2
    assert "array" in bad.stderr and "step" in bad.stderr
    done = up.corral(
        "run", "--array", "0-9%1", "--cpu", "0.1", "--mem", "32m",
        "--", "python", "-c", "import time; time.sleep(600)",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    array_id = done.stdout.strip()
    assert "10 sessions, at most 1 at once" in done.stderr
    ended = up.corral("session", "terminate", array_id)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith(f"array {array_id}: ")
    listed = json.loads(up.corral("session", "ls", "--array", array_id, "--json").stdout)
    assert len(listed) == 10
    assert all(e["status"] in {"CANCELLED", "TERMINATING", "TERMINATED"} for e in listed)
