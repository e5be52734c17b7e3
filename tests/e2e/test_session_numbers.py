"""Short session numbers and names in every command, and `session ls` like squeue/sacct:
`corral up` and the CLI as subprocesses, as a user runs them."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.cli.agent import detect_slots
from tests.e2e._up import Up, start_up

ENDED = ("TERMINATED", "CANCELLED", "ERROR")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent offering this host's slots."""
    yield from start_up(tmp_path)


def _ok(up: Up, *args: str) -> str:
    done = up.corral(*args)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def _info(up: Up, ref: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(_ok(up, "session", "info", ref, "--json"))
    return info


def _api(env: dict[str, str]) -> httpx.Client:
    """The API as the CLI of `env` reaches it (for waiting, which the CLI is not tested on)."""
    config_file = Path(env["XDG_CONFIG_HOME"]) / "corral" / "config.toml"
    config = tomllib.loads(config_file.read_text())
    url, token = env.get("CORRAL_URL", config["url"]), env.get("CORRAL_TOKEN", config["token"])
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _wait_for(up: Up, ref: str, statuses: tuple[str, ...], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    with _api(up.env) as http:
        while True:
            status = http.get(f"/v1/sessions/{ref}").raise_for_status().json()["status"]
            if status in statuses:
                return
            assert time.monotonic() < deadline, f"session {ref} still {status}"
            time.sleep(0.2)


def _rows(table: str) -> dict[str, dict[str, str]]:
    """A `session ls` table's rows by NUMBER, as {column: cell} (cells hold no spaces here)."""
    header, *lines = table.splitlines()
    columns = header.split()
    return {cells[0]: dict(zip(columns, cells, strict=True)) for cells in map(str.split, lines)}


def test_a_number_or_name_works_in_every_session_command(up: Up) -> None:
    """`run --detach` prints a number; info, ls (with the REASON a pending session waits for),
    explain, events, logs, history, terminate and rm take it, or the session's name."""
    cpus = str(detect_slots()["cpu"])  # what `corral up`'s agent offers: all of it
    hog = _ok(
        up, "run", "--detach", "--name", "hog", "--cpu", cpus, "--",
        "python", "-c", "import time; time.sleep(600)",
    ).strip()  # fmt: skip
    assert hog.isdigit(), hog
    _wait_for(up, "hog", ("RUNNING",))
    waiter = _ok(up, "run", "--detach", "--name", "waiter", "--", "python", "-c", "print('hi')")
    number = waiter.strip()
    assert int(number) > int(hog)

    listed = _rows(_ok(up, "session", "ls"))
    assert listed[hog]["STATUS"] == "RUNNING" and listed[hog]["REASON"] == "-"
    assert (listed[number]["NAME"], listed[number]["STATUS"]) == ("waiter", "PENDING")
    assert listed[number]["REASON"] == "no_capacity"
    assert "USER" not in next(iter(listed.values()))
    explained = _ok(up, "session", "explain", number)
    assert explained.startswith(f"session {number}: PENDING, position 1 of 1")
    assert "waiting (no_capacity)" in explained

    assert _ok(up, "session", "terminate", "hog").startswith(f"session {hog}: terminating")
    _wait_for(up, number, ENDED)
    _wait_for(up, hog, ENDED)
    assert _ok(up, "session", "logs", number) == "hi\n"
    assert _ok(up, "session", "logs", "waiter") == "hi\n"
    phases = json.loads(_ok(up, "session", "history", number, "--json"))
    assert phases and all("phase" in p for p in phases)
    info = _info(up, "waiter")
    assert (info["number"], info["status"]) == (int(number), "TERMINATED")
    events = json.loads(_ok(up, "events", "--session", number, "--json"))
    assert {e["entity_id"] for e in events} == {info["id"]}

    idle = up.corral("session", "ls")
    assert (idle.returncode, idle.stdout, idle.stderr) == (0, "", "no active sessions\n")
    everything = json.loads(_ok(up, "session", "ls", "--all-states", "--json"))
    assert [s["number"] for s in everything] == [int(number), int(hog)]
    ended = json.loads(_ok(up, "session", "ls", "--state", "terminated,error", "--json"))
    assert int(number) in {s["number"] for s in ended}
    recent = json.loads(_ok(up, "session", "ls", "--all-states", "--since", "1h", "--json"))
    assert {s["number"] for s in recent} == {int(number), int(hog)}
    bad_since = up.corral("session", "ls", "--since", "yesterday")
    assert bad_since.returncode == 2 and "since" in bad_since.stderr

    assert _ok(up, "session", "rm", number).startswith(f"removed session {number} (")
    gone = up.corral("session", "info", number)
    assert gone.returncode == 1 and f"'{number}'" in gone.stderr
    assert _ok(up, "session", "rm", "hog").startswith(f"removed session {hog} (")


def _user(up: Up, name: str) -> dict[str, str]:
    """A new non-admin user made through the API; the environment of their CLI."""
    with _api(up.env) as http:
        http.post("/v1/users", json={"name": name}).raise_for_status()
        issued = http.post(f"/v1/users/{name}/tokens", json={"name": "cli"}).raise_for_status()
        url = str(http.base_url).rstrip("/")
    return {**up.env, "CORRAL_URL": url, "CORRAL_TOKEN": issued.json()["token"]}


def test_a_user_sees_only_their_own_numbers_and_all_needs_an_admin(up: Up) -> None:
    """A non-admin's `ls --all` is a usage error; the admin's session number is not found for
    them; the admin's `ls --all` shows the USER column."""
    admins = _ok(up, "run", "--detach", "--", "python", "-c", "print(1)").strip()
    ada = Up(up.process, _user(up, "ada"))
    refused = ada.corral("session", "ls", "--all")
    assert refused.returncode == 2
    assert refused.stderr.startswith("corral: error: --all ")
    assert "needs an admin" in refused.stderr
    hidden = ada.corral("session", "info", admins)
    assert hidden.returncode == 1 and "no session you can see" in hidden.stderr
    mine = _ok(ada, "run", "--detach", "--", "python", "-c", "print(2)").strip()
    assert int(mine) > int(admins)
    everyone = _rows(_ok(up, "session", "ls", "--all", "--all-states"))
    assert everyone[mine]["USER"] == "ada"


# Each command is a fresh interpreter: seconds apiece on a busy machine.
pytestmark = pytest.mark.timeout(300)
