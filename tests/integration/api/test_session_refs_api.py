"""Every session route takes a session's id, number, unique id prefix or name (real app)."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.api.test_sessions_api import create, problem


async def _made(world: ApiWorld, caller: Caller, **fields: Any) -> dict[str, Any]:
    created = await create(world, caller, **fields)
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    return body


async def test_sessions_are_numbered_in_creation_order_across_users(world: ApiWorld) -> None:
    """Numbers are cluster-wide: 1, 2, 3 whoever submits; every answer carries the number."""
    made = [await _made(world, caller) for caller in (world.alice, world.bob, world.alice)]
    assert [s["number"] for s in made] == [1, 2, 3]
    listed = await world.http.get("/v1/sessions", headers=world.alice.headers)
    assert [s["number"] for s in listed.json()["items"]] == [3, 1]


async def test_every_session_route_accepts_the_number(world: ApiWorld) -> None:
    """GET, history, explain, logs, terminate and DELETE all find the session by number."""
    session = await _made(world, world.alice)
    number, headers = session["number"], world.alice.headers
    got = await world.http.get(f"/v1/sessions/{number}", headers=headers)
    assert got.json()["id"] == session["id"]
    history = await world.http.get(f"/v1/sessions/{number}/history", headers=headers)
    assert history.status_code == 200
    explained = await world.http.get(f"/v1/sessions/{number}/explain", headers=headers)
    assert (explained.json()["session_id"], explained.json()["number"]) == (session["id"], number)
    logs = await world.http.get(f"/v1/sessions/{number}/logs", headers=headers)
    assert logs.status_code == 200
    ended = await world.http.post(f"/v1/sessions/{number}/terminate", headers=headers)
    assert ended.json() == {
        "id": session["id"],
        "number": number,
        "outcome": "cancelled",
        "status": "CANCELLED",
        "retry_chain_stopped": False,  # it had no retry policy
        "chain_ended": [],
        "message": None,
    }
    removed = await world.http.delete(f"/v1/sessions/{number}", headers=headers)
    assert removed.status_code == 204
    problem(
        await world.http.get(f"/v1/sessions/{number}", headers=headers), 404, "session-not-found"
    )


async def test_a_name_or_id_prefix_finds_the_one_session(world: ApiWorld) -> None:
    """A unique name, and a prefix of the id (with or without its dashes), find the session."""
    session = await _made(world, world.alice, name="train")
    for ref in ("train", session["id"][:13], session["id"].replace("-", "")[:20]):
        found = await world.http.get(f"/v1/sessions/{ref}", headers=world.alice.headers)
        assert found.status_code == 200, (ref, found.text)
        assert found.json()["id"] == session["id"]


async def test_an_ambiguous_name_is_a_409_listing_the_numbers(world: ApiWorld) -> None:
    """Two sessions of one name: 409 naming both numbers; each is still found by number."""
    first = await _made(world, world.alice, name="sweep")
    second = await _made(world, world.alice, name="sweep")
    answer = await world.http.get("/v1/sessions/sweep/explain", headers=world.alice.headers)
    body = problem(answer, 409, "session-ambiguous")
    assert [c["number"] for c in body["candidates"]] == [first["number"], second["number"]]
    assert f"({first['number']}, {second['number']})" in body["detail"]


async def test_another_users_session_is_not_found_by_number_or_name(world: ApiWorld) -> None:
    """Bob's number and name answer 404 to Alice, and do not make Alice's own ambiguous."""
    bobs = await _made(world, world.bob, name="train")
    alices = await _made(world, world.alice, name="train")
    for ref in (bobs["number"], bobs["id"]):
        problem(
            await world.http.get(f"/v1/sessions/{ref}", headers=world.alice.headers),
            404,
            "session-not-found",
        )
    terminate = await world.http.post(
        f"/v1/sessions/{bobs['number']}/terminate", headers=world.alice.headers
    )
    problem(terminate, 404, "session-not-found")
    mine = await world.http.get("/v1/sessions/train", headers=world.alice.headers)
    assert mine.json()["id"] == alices["id"]


async def test_admins_resolve_names_across_users(world: ApiWorld) -> None:
    """An admin finds anyone's session by number; a name two users share is ambiguous."""
    bobs = await _made(world, world.bob, name="train")
    await _made(world, world.alice, name="train")
    found = await world.http.get(f"/v1/sessions/{bobs['number']}", headers=world.admin.headers)
    assert found.json()["owner"] == "bob"
    shared = await world.http.get("/v1/sessions/train", headers=world.admin.headers)
    body = problem(shared, 409, "session-ambiguous")
    assert sorted(c["owner"] for c in body["candidates"]) == ["alice", "bob"]


async def test_an_unknown_reference_is_a_404_naming_it(world: ApiWorld) -> None:
    """A number, name or prefix of no session is a 404 whose detail repeats it."""
    await _made(world, world.alice)
    for ref in ("999", "nothing-here", "ffff"):
        answer = await world.http.get(f"/v1/sessions/{ref}", headers=world.alice.headers)
        assert repr(ref) in problem(answer, 404, "session-not-found")["detail"]


async def test_listing_filters_by_time_and_says_why_pending_sessions_wait(
    world: ApiWorld,
) -> None:
    """`since` keeps the sessions created since; `reasons` fills PENDING sessions' `reason`;
    a `since` that is not a time is a 422 naming the field."""
    waiting = await _made(world, world.alice, resources={"cpu": 16})  # the agent has 8
    headers = world.alice.headers
    listed = await world.http.get(
        "/v1/sessions", params={"reasons": "true", "status": "PENDING"}, headers=headers
    )
    (item,) = listed.json()["items"]
    explained = await world.http.get(f"/v1/sessions/{waiting['number']}/explain", headers=headers)
    assert (item["id"], item["reason"]) == (waiting["id"], "request_too_large")
    assert explained.json()["code"] == item["reason"]
    unasked = await world.http.get("/v1/sessions", headers=headers)
    assert unasked.json()["items"][0]["reason"] is None
    later = await world.http.get(
        "/v1/sessions", params={"since": "2100-01-01T00:00:00"}, headers=headers
    )
    assert later.json()["items"] == []
    earlier = await world.http.get(
        "/v1/sessions", params={"since": "2000-01-01T00:00:00Z"}, headers=headers
    )
    assert [s["id"] for s in earlier.json()["items"]] == [waiting["id"]]
    bad = await world.http.get("/v1/sessions", params={"since": "yesterday"}, headers=headers)
    assert problem(bad, 422, "validation-error")["errors"][0]["field"] == "since"
