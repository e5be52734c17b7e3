"""`corral events [-f]` and `corral agent ls`: tables, JSON, and JSON lines for streams."""

from __future__ import annotations

import asyncio
import json

from tests.unit.client._fake_api import FakeApi, agent_json
from tests.unit.client.conftest import Cli

SESSION = "aaaa1111-0000-4000-8000-000000000000"


async def _two_moves(api: FakeApi) -> None:
    await api.move(SESSION, "SCHEDULED", "placed on node-1")
    await api.move(SESSION, "PREPARING")


def test_events_prints_a_table_of_changes(cli: Cli, api: FakeApi) -> None:
    """Each event is a row; a status change reads `FROM → TO (reason)`."""
    api.add_session(id=SESSION)
    api.events_end = True
    _emit_now(api)
    result = cli("events")
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.splitlines()
    assert header.split() == ["ID", "TIME", "KIND", "ENTITY", "DETAILS"]
    assert first.split()[3:] == [
        "session.status_changed", "session", SESSION, "PENDING", "→", "SCHEDULED", "(placed", "on",
        "node-1)",
    ]  # fmt: skip
    assert second.split()[0] == "2"
    params = api.requests[0].url.params
    assert (params["follow"], params["tail"]) == ("false", "20")


def test_events_json_and_since(cli: Cli, api: FakeApi) -> None:
    """`--json` is a list of events; `--since` skips the earlier ones."""
    api.add_session(id=SESSION)
    _emit_now(api)
    events = json.loads(cli("events", "--since", "1", "--json").stdout)
    assert [(e["id"], e["payload"]["to"]) for e in events] == [(2, "PREPARING")]


def test_events_says_how_to_read_on_when_more_remain(cli: Cli, api: FakeApi) -> None:
    """A full page ends with the `--since` to pass for the next one."""
    api.add_session(id=SESSION)
    _emit_now(api)
    result = cli("events", "--since", "0", "--limit", "1")
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr == "more events follow: add --since 1\n"


def test_events_follow_json_prints_one_event_per_line(cli: Cli, api: FakeApi) -> None:
    """`-f --json` streams JSON lines, filtered to a session with `--session`; a stream the
    manager ends (it is stopping) is an error after what it sent."""
    api.add_session(id=SESSION)
    api.events_end = True  # the fake stream ends once it has sent what it has
    _emit_now(api)
    result = cli("events", "-f", "--since", "0", "--session", SESSION, "--json")
    assert result.exit_code == 1, result.output
    assert "ended the event stream (the manager is stopping" in result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["payload"]["to"] for e in lines] == ["SCHEDULED", "PREPARING"]
    params = api.requests[0].url.params
    assert (params["entity_id"], params["since"]) == (SESSION, "0")


def test_events_follow_prints_aligned_lines(cli: Cli, api: FakeApi) -> None:
    """`-f` prints one line per event with the id, kind and change."""
    api.add_session(id=SESSION)
    api.events_end = True
    _emit_now(api)
    lines = cli("events", "-f", "--since", "0").stdout.splitlines()
    assert lines[0].split()[0] == "1"
    change = f"session.status_changed    session {SESSION}  PENDING → SCHEDULED (placed on node-1)"
    assert lines[0].endswith(change)
    assert len(lines) == 2


def test_events_shows_the_last_ones_newest_last(cli: Cli, api: FakeApi) -> None:
    """`--tail N` prints the last N events, oldest of them first."""
    api.add_session(id=SESSION)
    _emit_now(api)
    asyncio.run(api.move(SESSION, "PREPARED"))
    events = json.loads(cli("events", "--tail", "2", "--json").stdout)
    assert [e["payload"]["to"] for e in events] == ["PREPARING", "PREPARED"]
    assert cli("events", "--tail", "1", "--since", "0").exit_code == 2


def test_events_of_a_session_named_by_a_prefix(cli: Cli, api: FakeApi) -> None:
    """`--session` takes a unique prefix of the id, and asks for that session's events."""
    api.add_session(id=SESSION)
    _emit_now(api)
    result = cli("events", "--session", SESSION[:8], "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 2
    assert api.requests[-1].url.params["entity_id"] == SESSION


def test_events_follow_starts_after_the_tail_it_printed(cli: Cli, api: FakeApi) -> None:
    """`-f` prints the last events, then streams from the last one shown: none twice."""
    api.add_session(id=SESSION)
    api.events_end = True
    _emit_now(api)
    lines = cli("events", "-f", "--tail", "1", "--json").stdout.splitlines()
    assert [json.loads(line)["id"] for line in lines] == [2]
    stream = api.requests[-1].url.params
    assert (stream.get("follow"), stream["since"]) == (None, "2")


def test_agent_ls_is_a_table_of_agents(cli: Cli, api: FakeApi) -> None:
    """Agents with status, drain state, slots and kernels; filters reach the API."""
    api.agents = [agent_json("node-1"), agent_json("node-2", schedulable=False, status="LOST")]
    result = cli("agent", "ls", "--status", "alive")
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.splitlines()
    assert header.split()[:4] == ["ID", "STATUS", "SCHEDULABLE", "GROUP"]
    assert first.split()[:9] == [
        "node-1", "ALIVE", "yes", "default", "process", "1", "cpu=8", "mem=16GiB", "cpu=1",
    ]  # fmt: skip
    assert second.split()[:4] == ["node-2", "LOST", "no", "(drained)"]
    assert api.requests[0].url.params["status"] == "ALIVE"


def test_agent_ls_json(cli: Cli, api: FakeApi) -> None:
    """`--json` lists agents with exact slot amounts."""
    api.agents = [agent_json("node-1")]
    (agent,) = json.loads(cli("agent", "ls", "--json").stdout)
    assert agent["id"] == "node-1"
    assert agent["capacity"] == {"cpu": 8, "mem": 16 * 1024**3}


def _emit_now(api: FakeApi) -> None:
    asyncio.run(_two_moves(api))
