"""Job arrays as a user runs them: `corral run --array` on `corral up`, the CLI as processes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e._up import Up, start_up


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`corral up` with one local agent, shared by this module's tests (each its own arrays)."""
    yield from start_up(tmp_path_factory.mktemp("up"))


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
    """100 elements with %5: `run` prints the array's number; each element runs once and sees
    its CORRAL_ARRAY_INDEX and the array's number as CORRAL_ARRAY_ID; the server's records
    (each element's RUNNING interval) never overlap more than 5 deep; `session info NUMBER`
    shows the array whole and `NUMBER_7` one element."""
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
    number = done.stdout.strip()
    assert number.isdigit(), done.stdout
    assert f"array {number}: 100 sessions, at most 5 at once; element 0 is {number}_0" in (
        done.stderr
    )
    assert sorted(int(p.name) for p in seen.iterdir()) == list(range(100))
    assert {p.read_text() for p in seen.iterdir()} == {number}

    listed = up.corral("session", "ls", "--array", number, "--json")
    assert listed.returncode == 0, listed.stderr
    elements = json.loads(listed.stdout)
    assert sorted(e["array_index"] for e in elements) == list(range(100))
    assert {e["array_number"] for e in elements} == {int(number)}
    assert {(e["status"], e["exit_code"]) for e in elements} == {("TERMINATED", 0)}
    intervals = [
        (datetime.fromisoformat(e["started_at"]), datetime.fromisoformat(e["terminated_at"]))
        for e in elements
    ]
    assert 1 <= _most_at_once(intervals) <= 5

    whole = up.corral("session", "info", number)
    assert whole.returncode == 0, whole.stderr
    facts = _facts(whole.stdout)
    assert (facts["array"], facts["elements"]) == (number, "100, at most 5 at once")
    assert (facts["states"], facts["results"]) == ("100 TERMINATED", "100 success")
    assert f"{number}_[0-99]  TERMINATED  success  0" in " ".join(whole.stdout.split("\n"))
    as_json = json.loads(up.corral("session", "info", number, "--json").stdout)
    assert (as_json["count"], as_json["statuses"]) == (100, {"TERMINATED": 100})
    seventh = json.loads(up.corral("session", "info", f"{number}_7", "--json").stdout)
    assert (seventh["array_number"], seventh["array_index"]) == (int(number), 7)
    shown = _facts(up.corral("session", "info", f"{number}_7").stdout)
    assert shown["array"] == f"element 7 of job array {number}"
    assert shown["number"] == f"{seventh['number']} ({number}_7)"


def _facts(table: str) -> dict[str, str]:
    """`session info`'s `key: value` lines, up to the first blank line."""
    facts = {}
    for line in table.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        facts[key.strip()] = value.strip()
    return facts


def test_an_array_by_its_number_and_its_elements_in_every_command(up: Up) -> None:
    """An array detaches printing its number; `ls` collapses its pending elements like squeue
    (`N_[1-9%1]`); logs, terminate and rm take `N_I`; a command needing one session refuses
    the array's number (exit 2, naming `N_INDEX`); `--after N` waits for every element;
    `terminate N` ends them all and `rm N` removes them all."""
    bad = up.corral("run", "--array", "0-5:0", "--", "python", "-c", "pass")
    assert bad.returncode == 2
    assert "array" in bad.stderr and "step" in bad.stderr
    done = up.corral(
        "run", "--array", "0-9%1", "--cpu", "0.1", "--mem", "32m", "--name", "sweep",
        "--", "python", "-c",
        "import os, time; print('element', os.environ['CORRAL_ARRAY_INDEX'], flush=True); "
        "time.sleep(600)",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    number = done.stdout.strip()
    assert "10 sessions, at most 1 at once" in done.stderr
    after = up.corral("run", "--detach", "--after", number, "--", "python", "-c", "pass")
    assert after.returncode == 0, after.stderr
    waiter = after.stdout.strip()
    _wait_until(up, f"{number}_0", "RUNNING")

    rows = [line.split()[0] for line in up.corral("session", "ls").stdout.splitlines()[1:]]
    assert f"{number}_0" in rows and f"{number}_[1-9%1]" in rows
    assert _wait_for_log(up, f"{number}_0") == "element 0\n"
    refused = up.corral("session", "logs", number)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"corral: error: '{number}' names job array {number}")
    assert f"like {number}_0" in refused.stderr
    by_name = json.loads(up.corral("session", "info", "sweep", "--json").stdout)
    assert (by_name["number"], by_name["count"]) == (int(number), 10)

    one = up.corral("session", "terminate", f"{number}_5")
    assert one.returncode == 0, one.stderr
    assert " cancelled (CANCELLED)" in one.stdout
    ended = up.corral("session", "terminate", number)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith(f"array {number}: 8 cancelled, 1 terminating, 1 had already")
    listed = json.loads(up.corral("session", "ls", "--array", number, "--json").stdout)
    assert len(listed) == 10
    assert all(e["status"] in {"CANCELLED", "TERMINATING", "TERMINATED"} for e in listed)
    _wait_until(up, waiter, "CANCELLED")  # afterok on every element: it can never run
    _wait_until(up, f"{number}_0", "TERMINATED")
    removed = up.corral("session", "rm", number)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout == f"removed job array {number} (10 sessions)\n"
    gone = up.corral("session", "info", f"{number}_3")
    assert gone.returncode == 1 and f"'{number}_3'" in gone.stderr


def _wait_until(up: Up, ref: str, status: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        shown = json.loads(up.corral("session", "info", ref, "--json").stdout)
        if shown["status"] == status:
            return
        assert time.monotonic() < deadline, f"{ref} still {shown['status']}"
        time.sleep(0.5)


def _wait_for_log(up: Up, ref: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        out = up.corral("session", "logs", ref).stdout
        if out:
            return out
        assert time.monotonic() < deadline, f"{ref} printed nothing"
        time.sleep(0.5)
