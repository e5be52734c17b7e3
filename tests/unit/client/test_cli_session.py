"""`corral session ...`: tables, JSON, raw logs, and errors as `corral: error:` with exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from corral.cli import _plain, _remote
from corral.client import Client
from corral.client._http import PlainCall
from tests.unit.client._fake_api import URL, FakeApi, kernel_json
from tests.unit.client.conftest import Cli, cli_app

FIRST = "aaaa1111-0000-4000-8000-000000000000"
SECOND = "bbbb2222-0000-4000-8000-000000000000"


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_ls_prints_an_aligned_table_of_the_callers_sessions(cli: Cli, api: FakeApi) -> None:
    """Headers and one row per session, columns aligned; only the caller's own are asked for,
    active ones, with the reasons pending ones wait."""
    api.add_session(id=FIRST, name="train", status="RUNNING")
    api.add_session(id=SECOND, reason="no_capacity")
    api.add_session(owner="bob")
    result = cli("session", "ls")
    assert result.exit_code == 0, result.output
    header, second, first = result.stdout.splitlines()
    assert header.split() == [
        "NUMBER", "NAME", "STATUS", "REASON", "GROUP", "AGE", "TIME", "EXIT",
    ]  # fmt: skip
    assert first.split()[:5] == ["1", "train", "RUNNING", "-", "default"]
    assert second.split()[:5] == ["2", "-", "PENDING", "no_capacity", "default"]
    assert header.index("STATUS") == first.index("RUNNING")
    params = api.sent("GET", "/v1/sessions")[0].url.params
    assert (params["owner"], params["reasons"]) == ("alice", "true")
    assert "TERMINATED" not in params.get_list("status")
    assert {"PENDING", "RUNNING"} <= set(params.get_list("status"))


def test_ls_all_asks_for_every_owner_and_shows_the_owner(cli: Cli, api: FakeApi) -> None:
    """An admin's `--all` sends no owner filter and adds a USER column."""
    api.role = "admin"
    api.add_session(id=FIRST, owner="bob")
    result = cli("session", "ls", "--all")
    assert result.exit_code == 0, result.output
    assert _lines(result.stdout)[1][:3] == ["1", "-", "bob"]
    assert "owner" not in api.sent("GET", "/v1/sessions")[0].url.params


def test_ls_all_by_a_non_admin_is_a_usage_error(cli: Cli, api: FakeApi) -> None:
    """`--all` (or another `--user`) from a user says it needs an admin, exit 2, no listing."""
    for flags in (["--all"], ["--user", "bob"]):
        result = cli("session", "ls", *flags)
        assert result.exit_code == 2
        assert result.stderr.startswith("corral: error: ")
        assert "needs an admin" in result.stderr
    assert api.sent("GET", "/v1/sessions") == []


def test_ls_all_states_and_since(cli: Cli, api: FakeApi) -> None:
    """`--all-states` asks for every status; `--since 2h` is passed on for the API to read."""
    cli("session", "ls", "--all-states", "--since", "2h")
    params = api.sent("GET", "/v1/sessions")[0].url.params
    assert (params.get_list("status"), params["since"]) == ([], "2h")
    both = cli("session", "ls", "--all-states", "--state", "running")
    assert both.exit_code == 2 and "--all-states" in both.stderr


def test_ls_json_is_a_list_of_sessions(cli: Cli, api: FakeApi) -> None:
    """`--json` prints a JSON list with the sessions' fields."""
    api.add_session(id=FIRST, status="ERROR", exit_code=3)
    result = cli("session", "ls", "--json", "--state", "error")
    sessions = json.loads(result.stdout)
    assert [(s["number"], s["id"], s["status"], s["exit_code"]) for s in sessions] == [
        (1, FIRST, "ERROR", 3)
    ]


def test_ls_filters_by_status_case_insensitively(cli: Cli, api: FakeApi) -> None:
    """`--state running,error -s PENDING` asks the API for those three statuses."""
    cli("session", "ls", "--state", "running,error", "-s", "PENDING")
    params = api.sent("GET", "/v1/sessions")[0].url.params
    assert params.get_list("status") == ["RUNNING", "ERROR", "PENDING"]


def test_ls_refuses_an_unknown_status(cli: Cli, api: FakeApi) -> None:
    """A misspelt status is a usage error (exit 2) listing the statuses, before any request."""
    result = cli("session", "ls", "--state", "RUNING")
    assert result.exit_code == 2
    assert "corral: error: --state 'RUNING' is not a session state" in result.stderr
    assert api.requests == []


def test_ls_limit_stops_after_enough_sessions(cli: Cli, api: FakeApi) -> None:
    """`--limit 2` prints two sessions and asks for no more than two."""
    for _ in range(5):
        api.add_session()
    result = cli("session", "ls", "--limit", "2", "--json")
    assert len(json.loads(result.stdout)) == 2
    assert api.sent("GET", "/v1/sessions")[0].url.params["limit"] == "2"


def test_ls_follows_every_page(cli: Cli, api: FakeApi) -> None:
    """A listing longer than the server's page is read to its end, page by page."""
    api.page_size = 2
    for _ in range(5):
        api.add_session()
    result = cli("session", "ls")
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == list("54321")
    cursors = [r.url.params.get("cursor") for r in api.sent("GET", "/v1/sessions")]
    assert cursors == [None, "2", "4"]
    assert [s["number"] for s in json.loads(cli("session", "ls", "--json").stdout)] == [
        5, 4, 3, 2, 1,
    ]  # fmt: skip


def test_ls_without_sessions_says_so_on_stderr(cli: Cli) -> None:
    """An empty listing prints nothing on stdout and a note on stderr."""
    result = cli("session", "ls")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "no active sessions\n")


def test_info_shows_the_session_and_its_kernels(cli: Cli, api: FakeApi) -> None:
    """Facts as `key: value` lines, then a table of kernels; a prefix finds the session."""
    api.add_session(
        id=FIRST,
        status="ERROR",
        failure_cause="agent_lost",
        exit_code=137,
        cluster_size=2,
        kernels=[
            kernel_json(0, status="ERROR", agent_id="node-1", failure_cause="agent_lost"),
            kernel_json(1, status="TERMINATED", agent_id="node-2", exit_code=0),
        ],
    )
    result = cli("session", "info", "aaaa")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "number:     1" in out
    assert f"id:         {FIRST}" in out
    assert "command:    python -c 'print(42)'" in out
    assert "failure:    agent_lost" in out
    kernels = _lines(out.split("\n\n")[1])
    assert kernels[0][:6] == ["KERNEL", "ROLE", "STATUS", "AGENT", "RESTARTS", "EXIT"]
    assert kernels[1][:7] == ["0", "main", "ERROR", "node-1", "0", "-", "agent_lost"]
    assert kernels[2][:6] == ["1", "sub", "TERMINATED", "node-2", "0", "0"]
    assert "restarts:" not in out  # no restart policy: no line for it


def test_info_shows_the_restart_limit_and_each_kernels_restarts(cli: Cli, api: FakeApi) -> None:
    """With a restart limit: the limit and the restarts made, and per kernel its count, marked
    while a restart is under way."""
    api.add_session(
        id=FIRST,
        status="RUNNING",
        restart_limit=2,
        restarts=1,
        cluster_size=2,
        kernels=[
            kernel_json(0, status="RUNNING", agent_id="node-1", restarts=1, restarting=True),
            kernel_json(1, status="RUNNING", agent_id="node-2"),
        ],
    )
    out = cli("session", "info", FIRST).stdout
    assert "restarts:   up to 2 per kernel; 1 made" in out
    kernels = _lines(out.split("\n\n")[1])
    assert kernels[1][:6] == ["0", "main", "RUNNING", "node-1", "1", "(restarting)"]
    assert kernels[2][:5] == ["1", "sub", "RUNNING", "node-2", "0"]


def test_info_json_includes_the_kernels(cli: Cli, api: FakeApi) -> None:
    """`info --json` prints the session with its kernels."""
    api.add_session(id=FIRST)
    data = json.loads(cli("session", "info", FIRST, "--json").stdout)
    assert data["id"] == FIRST
    assert [k["cluster_index"] for k in data["kernels"]] == [0]


def test_logs_prints_the_bytes_untouched(cli: Cli, api: FakeApi) -> None:
    """Logs reach stdout byte for byte, stderr logs too with `--stderr`."""
    api.add_session(id=FIRST)
    api.logs[(FIRST, "stdout")] = b"line\r\n\xff\x00raw"
    api.logs[(FIRST, "stderr")] = b"warning\n"
    assert cli("session", "logs", FIRST).stdout_bytes == b"line\r\n\xff\x00raw"
    assert cli("session", "logs", FIRST, "--stderr").stdout_bytes == b"warning\n"
    assert api.sent("GET", f"/v1/sessions/{FIRST}/logs")[1].url.params["stream"] == "stderr"


def test_logs_follow_streams_until_the_session_ends(cli: Cli, api: FakeApi) -> None:
    """`logs -f` copies the stream of the chosen kernel until the server ends it."""
    api.add_session(id=FIRST)
    api.logs[(FIRST, "stdout")] = b"done\n"

    async def end(session_id: str) -> None:
        await api.finish(session_id)

    api.on_follow = end
    result = cli("session", "logs", "-f", "--kernel", "1", FIRST)
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"done\n"
    params = api.sent("GET", f"/v1/sessions/{FIRST}/logs")[0].url.params
    assert (params["follow"], params["kernel"]) == ("true", "1")


def test_history_is_a_table_of_phases(cli: Cli, api: FakeApi) -> None:
    """Each scheduling phase is a row with its result and attempts."""
    api.add_session(id=FIRST)
    api.history[FIRST] = [
        {
            "phase": "schedule",
            "from_status": "PENDING",
            "to_status": "SCHEDULED",
            "result": "SUCCESS",
            "error_code": None,
            "message": "",
            "attempts": 2,
            "created_at": "2030-01-01T09:00:00+00:00",
            "updated_at": "2030-01-01T09:00:05+00:00",
        }
    ]
    rows = _lines(cli("session", "history", FIRST).stdout)
    assert rows[0][:5] == ["PHASE", "FROM", "TO", "RESULT", "ATTEMPTS"]
    assert rows[1][:7] == ["schedule", "PENDING", "SCHEDULED", "SUCCESS", "2", "-", "-"]
    history = json.loads(cli("session", "history", FIRST, "--json").stdout)
    assert history[0]["attempts"] == 2


def test_explain_says_where_the_session_waits_and_why(cli: Cli, api: FakeApi) -> None:
    """The queue position and the scheduler's reason, in words."""
    api.add_session(id=FIRST)
    out = cli("session", "explain", "1").stdout
    assert out == (
        "session 1: PENDING, position 1 of 2 in resource group 'default'\n"
        "  waiting (no_capacity): no agent has 8 cpu free\n"
    )
    assert json.loads(cli("session", "explain", FIRST, "--json").stdout)["position"] == 1


def test_terminate_reports_the_outcome(cli: Cli, api: FakeApi) -> None:
    """Terminating a running session says it is terminating; again, that it had ended."""
    api.add_session(id=FIRST, status="RUNNING")
    assert cli("session", "terminate", "1").stdout == "session 1: terminating (TERMINATING)\n"
    api.sessions[FIRST]["status"] = "TERMINATED"
    assert cli("session", "terminate", FIRST).stdout == (
        "session 1 had already ended (TERMINATED)\n"
    )


def test_rm_removes_ended_sessions_and_refuses_running_ones(cli: Cli, api: FakeApi) -> None:
    """An ended session is removed; a running one is an error (exit 1) from the API."""
    api.add_session(id=FIRST, status="TERMINATED")
    api.add_session(id=SECOND, status="RUNNING")
    removed = cli("session", "rm", FIRST)
    assert (removed.exit_code, removed.stdout) == (0, f"removed session 1 ({FIRST})\n")
    refused = cli("session", "rm", SECOND)
    assert refused.exit_code == 1
    assert refused.stderr == f"corral: error: session {SECOND} has not ended\n"
    assert SECOND in api.sessions


def test_an_unknown_session_exits_1_with_the_apis_message(cli: Cli) -> None:
    """A 404 becomes `corral: error: <detail>` and exit code 1."""
    result = cli("session", "info", FIRST)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"corral: error: no session {FIRST}\n"


def test_an_ambiguous_prefix_is_a_usage_error_naming_the_numbers(cli: Cli, api: FakeApi) -> None:
    """A prefix of two sessions is the API's 409, which names both numbers: exit 2, a reference
    to retype."""
    api.add_session(id="abcd1111-0000-4000-8000-000000000000")
    api.add_session(id="abcd2222-0000-4000-8000-000000000000")
    result = cli("session", "info", "abcd")
    assert result.exit_code == 2
    assert result.stderr.startswith("corral: error: ")
    assert "fits several sessions (1, 2)" in result.stderr


@pytest.mark.parametrize("args", [("session", "ls"), ("session", "info", "1")])
def test_a_refused_token_exits_1(
    cli: Cli, api: FakeApi, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """A 401 prints the API's reason, through the plain client (`ls`) as through the SDK's."""
    transport = httpx.MockTransport(api.handle)
    monkeypatch.setattr(_remote, "connect", lambda: Client(URL, "wrong", transport=transport))
    monkeypatch.setattr(_plain, "plain_call", lambda: PlainCall(URL, "wrong", send=api.plain_send))
    result = cli(*args)
    assert result.exit_code == 1
    assert result.stderr == "corral: error: the token is unknown or expired\n"


def test_no_configuration_says_how_to_configure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a config file or variables, the command exits 2 pointing at `corral up`."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    result = Cli(FakeApi()).runner.invoke(cli_app(), ["session", "ls"])
    assert result.exit_code == 2
    assert result.stderr == (
        "corral: error: no corral server is configured: run `corral up` or set CORRAL_URL "
        "and CORRAL_TOKEN\n"
    )


def test_info_shows_the_kernels_ready_condition_and_requeue_state(cli: Cli, api: FakeApi) -> None:
    api.add_session(
        id=FIRST,
        status="PENDING",
        kernels_ready=None,
        requeue_count=2,
        evicted_at="2030-01-01T00:05:00Z",
        eviction_reason="KernelsReadyTimeout",
        requeue_at="2030-01-01T00:07:00Z",
    )
    out = cli("session", "info", "1").stdout
    assert "evicted 2 time(s), last" in out and "(KernelsReadyTimeout)" in out
    assert "next requeue:" in out
    api.add_session(
        id=SECOND, status="RUNNING", kernels_ready=True, kernels_ready_reason="Ready",
        kernels_ready_at="2030-01-01T00:09:00Z",
    )  # fmt: skip
    facts = dict(
        line.split(":", 1)
        for line in cli("session", "info", "2").stdout.splitlines()[:40]
        if ":" in line
    )
    assert facts["kernels ready"].strip().startswith("yes (Ready, since")


def test_activate_puts_a_deactivated_session_back_and_refuses_others(
    cli: Cli, api: FakeApi
) -> None:
    api.add_session(id=FIRST, status="PENDING", active=False, deactivated_at="2030-01-01T00:00:00Z")
    info = cli("session", "info", "1").stdout
    assert "active:" in info and "corral session activate 1" in info
    done = cli("session", "activate", "1")
    assert done.stdout == "session 1: activated (PENDING), back in the queue\n"
    again = cli("session", "activate", "1")
    assert again.exit_code == 1
    assert again.stderr == "corral: error: session 1: it is not deactivated\n"
