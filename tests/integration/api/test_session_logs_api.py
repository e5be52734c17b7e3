"""`GET /v1/sessions/{id}/logs`: tail, since, timestamps, every kernel prefixed, the size cap."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from corral.domain.types import AgentId, KernelId
from corral.store.kernel_logs import LogChunk
from tests.integration.api.conftest import ApiWorld
from tests.integration.api.test_sessions_api import create, problem


async def _running(world: ApiWorld, **fields: Any) -> dict[str, Any]:
    sid = (await create(world, world.alice, **fields)).json()["id"]
    await world.cluster.settle()
    session: dict[str, Any] = (
        await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)
    ).json()
    assert session["status"] == "RUNNING"
    return session


async def _upload(world: ApiWorld, kernel: dict[str, Any], offset: int, data: bytes) -> None:
    """One chunk through the manager's upload path (the cap applies), a second later."""
    world.cluster.clock.advance(1)
    chunk = LogChunk(KernelId(uuid.UUID(kernel["id"])), "stdout", offset, data)
    await world.agents.upload_logs(AgentId(kernel["agent_id"]), [chunk])


async def _logs(world: ApiWorld, sid: str, **params: Any) -> bytes:
    response = await world.http.get(
        f"/v1/sessions/{sid}/logs", params=params, headers=world.alice.headers
    )
    assert response.status_code == 200, response.text
    return response.content


async def test_tail_since_and_timestamps_of_one_kernel(world: ApiWorld) -> None:
    """One kernel: its bytes as written; the last lines; since a time; each line's time."""
    session = await _running(world)
    sid, kernel = session["id"], session["kernels"][0]
    await _upload(world, kernel, 0, b"one\ntwo\n")
    second = world.cluster.clock()
    await _upload(world, kernel, 8, b"three\nfour")
    assert await _logs(world, sid) == b"one\ntwo\nthree\nfour"
    assert await _logs(world, sid, tail=2) == b"three\nfour"
    assert await _logs(world, sid, since=(second + timedelta(seconds=1)).isoformat()) == (
        b"three\nfour"
    )
    stamped = (await _logs(world, sid, timestamps=True, tail=3)).decode().splitlines()
    assert stamped == [
        "2030-01-01T00:00:01.000Z two",
        "2030-01-01T00:00:02.000Z three",
        "2030-01-01T00:00:02.000Z four",
    ]


async def test_every_kernel_prefixed_or_one_alone(world: ApiWorld) -> None:
    """Several kernels: each line says its kernel, in the order stored; `kernel` shows one."""
    session = await _running(world, cluster_size=2)
    sid = session["id"]
    first, second = sorted(session["kernels"], key=lambda k: k["cluster_index"])
    await _upload(world, first, 0, b"a1\n")
    await _upload(world, second, 0, b"b1\nb2\n")
    await _upload(world, first, 3, b"a2\n")
    assert (await _logs(world, sid)).decode().splitlines() == [
        "[kernel 0] a1",
        "[kernel 1] b1",
        "[kernel 1] b2",
        "[kernel 0] a2",
    ]
    assert await _logs(world, sid, kernel=1, tail=1) == b"b2\n"  # one kernel: as written


async def test_a_capped_log_says_what_was_dropped(world: ApiWorld) -> None:
    """Past the manager's cap the oldest output goes; the first line shown says how much."""
    world.agents.log_cap_bytes = 1000
    session = await _running(world)
    sid, kernel = session["id"], session["kernels"][0]
    line = b"x" * 99 + b"\n"
    for i in range(30):  # 3,000 bytes in chunks of 100
        await _upload(world, kernel, i * 100, line)
    shown = await _logs(world, sid)
    assert shown.startswith(b"[corral: 1.9 kB of earlier output dropped]\n" + line)
    assert len(shown.splitlines()) == 12  # the note, then the newest 1,100 bytes
    assert await _logs(world, sid, tail=2) == line * 2  # far from the cut: no note


async def test_bad_log_parameters_are_problems_naming_the_field(world: ApiWorld) -> None:
    """An unreadable `since`, or an offset with several kernels, is a 422 naming the field."""
    session = await _running(world, cluster_size=2)
    for params, field in (({"since": "yesterday"}, "since"), ({"offset": 5}, "offset")):
        response = await world.http.get(
            f"/v1/sessions/{session['id']}/logs", params=params, headers=world.alice.headers
        )
        body = problem(response, 422, "validation-error")
        assert body["errors"][0]["field"] == field
    other = await world.http.get(
        f"/v1/sessions/{session['id']}/logs", params={"tail": 5}, headers=world.bob.headers
    )
    problem(other, 404, "session-not-found")


async def test_follow_from_the_tail_until_the_session_ends(world: ApiWorld) -> None:
    """`follow` with `tail` starts at the last lines and ends with the session."""
    session = await _running(world)
    sid, kernel = session["id"], session["kernels"][0]
    await _upload(world, kernel, 0, b"old\nnew\n")
    await world.cluster.agent.exit([KernelId(uuid.UUID(kernel["id"]))], exit_code=0)
    await world.cluster.settle()
    assert await _logs(world, sid, follow=True, tail=1) == b"new\n"
