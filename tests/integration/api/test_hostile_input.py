"""Every hostile request of issue 33, one at a time, against the manager's app on SQLite and
PostgreSQL: each is a 4xx problem naming what was wrong, nothing is written, and a plain
user's session is still scheduled afterwards."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa

from corral.domain.bounds import DEFAULT_MAX_REQUEST_BYTES
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.store.tables import agents, events, resource_groups, sessions
from tests.integration.api.conftest import JOIN, ApiWorld
from tests.integration.api.test_sessions_api import BODY, create, problem

SPEC = {"image": "python", "command": ["python", "-c", "print(1)"]}


@dataclass(frozen=True)
class Hostile:
    """One request a hostile user sends, and the answer it must get."""

    method: str
    path: str
    body: Any = None  # JSON, or bytes sent as they are (for what JSON libraries will not write)
    status: int = 422
    kind: str = "validation-error"
    where: str | None = None  # the field the problem names
    caller: str = "alice"  # alice (a plain user), admin, or join (an agent's join token)
    params: dict[str, str] = field(default_factory=dict)


def raw(text: str) -> bytes:
    """A JSON body written by hand: escapes like \\ud800 pass as they are."""
    return text.encode("ascii")


HOSTILE: dict[str, Hostile] = {
    "huge cpu int": Hostile(
        "POST",
        "/v1/sessions",
        {**SPEC, "resources": {"cpu": 1208925819614629174706176}},
        where="resources.cpu",
    ),
    "mem 1e30": Hostile(
        "POST", "/v1/sessions", {**SPEC, "resources": {"mem": 1e30}}, where="resources.mem"
    ),
    "cpu x kernels past the arrays": Hostile(
        "POST",
        "/v1/sessions",
        {**SPEC, "resources": {"cpu": 10**15}, "cluster_size": 16},
        where="resources.cpu",
    ),
    "lone surrogate in command": Hostile(
        "POST",
        "/v1/sessions",
        raw('{"image": "python", "command": ["python", "\\ud800"]}'),
        where="command.1",
    ),
    "lone surrogate in env": Hostile(
        "POST",
        "/v1/sessions",
        raw('{"image": "python", "command": ["true"], "env": {"A": "\\udfff"}}'),
        where="env.A",
    ),
    "NUL in command": Hostile(
        "POST", "/v1/sessions", {**SPEC, "command": ["a\0b"]}, where="command.0"
    ),
    "NUL in image": Hostile("POST", "/v1/sessions", {**SPEC, "image": "python\0"}, where="image"),
    "NUL in workdir": Hostile(
        "POST", "/v1/sessions", {**SPEC, "workdir": "/tmp/\0"}, where="workdir"
    ),
    "NUL in name": Hostile("POST", "/v1/sessions", {**SPEC, "name": "a\0"}, where="name"),
    "2 MB argument": Hostile(
        "POST", "/v1/sessions", {**SPEC, "command": ["echo", "x" * 2_000_000]}, where="command.1"
    ),
    "10 MB command": Hostile(
        "POST",
        "/v1/sessions",
        {**SPEC, "command": ["echo", "x" * 10_000_000]},
        status=413,
        kind="request-too-large",
    ),
    "starts_at 9999-12-31T23:59:59-14:00": Hostile(
        "POST",
        "/v1/sessions",
        {**SPEC, "starts_at": "9999-12-31T23:59:59-14:00"},
        where="starts_at",
    ),
    "NUL in an array's command": Hostile(
        "POST", "/v1/arrays", {**SPEC, "array": "0-3", "command": ["\0"]}, where="command.0"
    ),
    "NUL in a query": Hostile(
        "GET", "/v1/sessions", params={"resource_group": "a\0"}, where="resource_group"
    ),
    "NUL in a session reference": Hostile("GET", "/v1/sessions/a%00b", where="path"),
    "agent with huge slots": Hostile(
        "POST",
        "/v1/agents/register",
        {"agent_id": "evil", "address": "10.0.0.66", "slots": {"cpu": 2**80}},
        where="slots.cpu",
        caller="join",
    ),
    "agent label with NUL": Hostile(
        "POST",
        "/v1/agents/register",
        {"agent_id": "evil", "address": "h", "slots": {"cpu": 1}, "labels": {"a": "\0"}},
        where="labels.a",
        caller="join",
    ),
    "group option timeout past a year": Hostile(
        "POST",
        "/v1/resource-groups",
        {"name": "evil", "options": {"phase_limits": {"PrepareSessions": {"timeout_s": 1e300}}}},
        where="options.phase_limits.PrepareSessions.timeout_s",
        caller="admin",
    ),
    "group description with a surrogate": Hostile(
        "POST",
        "/v1/resource-groups",
        raw('{"name": "evil", "description": "\\ud83d"}'),
        where="description",
        caller="admin",
    ),
}


async def _counts(world: ApiWorld) -> dict[str, int]:
    async with world.cluster.db.read() as conn:
        return {
            table.name: int(await conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0)
            for table in (sessions, agents, resource_groups, events)
        }


def _headers(world: ApiWorld, caller: str) -> dict[str, str]:
    if caller == "join":
        return {"Authorization": f"Bearer {JOIN}"}
    return (world.admin if caller == "admin" else world.alice).headers


@pytest.mark.parametrize("case", list(HOSTILE.values()), ids=list(HOSTILE))
async def test_a_hostile_request_is_refused_and_hurts_no_one(
    world: ApiWorld, case: Hostile
) -> None:
    """The documented 4xx problem naming the field; nothing written; others still served."""
    before = await _counts(world)
    headers = _headers(world, case.caller)
    if isinstance(case.body, bytes):
        headers = {**headers, "Content-Type": "application/json"}
        answer = await world.http.request(
            case.method, case.path, content=case.body, headers=headers, params=case.params
        )
    else:
        answer = await world.http.request(
            case.method, case.path, json=case.body, headers=headers, params=case.params
        )
    body = problem(answer, case.status, case.kind)
    if case.where is not None:
        assert case.where in [error["field"] for error in body["errors"]], body
    assert await _counts(world) == before
    await _a_plain_user_is_still_served(world)


async def _a_plain_user_is_still_served(world: ApiWorld) -> None:
    made = await create(world, world.bob)
    assert made.status_code == 201, made.text
    listed = await world.http.get("/v1/sessions", headers=world.admin.headers)
    assert listed.status_code == 200, listed.text
    await world.cluster.run("ScheduleNewSessions")
    made_id = SessionId(uuid.UUID(made.json()["id"]))
    assert await world.cluster.status(made_id) is SessionStatus.PREPARING  # placed, asked
    explained = await world.http.get(
        f"/v1/sessions/{made.json()['id']}/explain", headers=world.bob.headers
    )
    assert explained.status_code == 200, explained.text


async def test_a_creation_id_reused_with_another_body_is_409_and_writes_nothing(
    world: ApiWorld,
) -> None:
    """The same key with a different body: 409 naming the differing fields; the first
    session stays the only one; a plain user is still served."""
    first = await create(world, world.alice, creation_id="once")
    assert first.status_code == 201, first.text
    before = await _counts(world)
    again = await create(world, world.alice, creation_id="once", command=["rm", "-rf", "/"])
    assert problem(again, 409, "creation-id-conflict")["fields"] == ["command"]
    assert await _counts(world) == before
    await _a_plain_user_is_still_served(world)


async def test_the_body_cap_applies_without_a_content_length(world: ApiWorld) -> None:
    """A body streamed without Content-Length is cut at the cap: 413, nothing written."""
    before = await _counts(world)
    chunk = json.dumps({**BODY, "env": {"A": "x" * 1024}}).encode()

    async def stream() -> Any:
        yield b'{"image": "python", "command": ["true"], "name": "' + b"x" * 1024
        sent = 0
        while sent <= DEFAULT_MAX_REQUEST_BYTES:
            yield b"y" * len(chunk)
            sent += len(chunk)
        yield b'"}'

    answer = await world.http.post(
        "/v1/sessions",
        content=stream(),
        headers={**world.alice.headers, "Content-Type": "application/json"},
    )
    problem(answer, 413, "request-too-large")
    assert await _counts(world) == before
    await _a_plain_user_is_still_served(world)
