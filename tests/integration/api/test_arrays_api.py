"""`/v1/arrays` over HTTP (the real app in-process), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from corral.controller import sessions as controller_module
from corral.store.tables import session_dependencies
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.api.test_sessions_api import BODY, create, problem


async def submit(world: ApiWorld, caller: Caller, array: str, **fields: Any) -> httpx.Response:
    body = {**BODY, "array": array, **fields}
    return await world.http.post("/v1/arrays", json=body, headers=caller.headers)


async def elements(world: ApiWorld, caller: Caller, array_id: str) -> list[dict[str, Any]]:
    found = await world.http.get(
        "/v1/sessions", params={"array_id": array_id, "limit": 1000}, headers=caller.headers
    )
    assert found.status_code == 200, found.text
    items: list[dict[str, Any]] = found.json()["items"]
    return sorted(items, key=lambda s: s["array_index"])


async def all_sessions(world: ApiWorld, caller: Caller) -> list[dict[str, Any]]:
    found = await world.http.get("/v1/sessions", headers=caller.headers)
    items: list[dict[str, Any]] = found.json()["items"]
    return items


async def test_an_array_is_one_session_per_index_named_by_its_first_element(
    world: ApiWorld,
) -> None:
    """201 with the elements in index order; every element carries the array's id (its first
    element's session id) and its own index; the throttle is answered back."""
    response = await submit(world, world.alice, "0-15:4,3,3%2", name="sweep")
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["count"], body["throttle"]) == (5, 2)
    assert [e["index"] for e in body["elements"]] == [0, 3, 4, 8, 12]
    assert body["id"] == body["elements"][0]["session_id"]
    listed = await elements(world, world.alice, body["id"])
    assert [(s["id"], s["array_index"]) for s in listed] == [
        (e["session_id"], e["index"]) for e in body["elements"]
    ]
    assert {(s["array_id"], s["name"], s["status"]) for s in listed} == {
        (body["id"], "sweep", "PENDING")
    }
    one = await world.http.get(
        f"/v1/sessions/{body['elements'][1]['session_id']}", headers=world.alice.headers
    )
    assert (one.json()["array_id"], one.json()["array_index"]) == (body["id"], 3)


async def test_the_same_creation_id_returns_the_same_array(world: ApiWorld) -> None:
    """A retried request (same creation_id) answers 200 with the array it created first."""
    first = await submit(world, world.alice, "1-3", creation_id="sweep-1")
    again = await submit(world, world.alice, "1-3", creation_id="sweep-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert len(await all_sessions(world, world.alice)) == 3


async def test_the_same_creation_id_with_another_array_is_409(world: ApiWorld) -> None:
    """More indexes (or another spec) under an array's creation_id is refused, 409 naming the
    fields; no element is added to the array."""
    first = await submit(world, world.alice, "1-3", creation_id="sweep-2")
    assert first.status_code == 201, first.text
    wider = await submit(world, world.alice, "1-5", creation_id="sweep-2", priority=3)
    assert problem(wider, 409, "creation-id-conflict")["fields"] == ["array", "priority"]
    assert len(await all_sessions(world, world.alice)) == 3


@pytest.mark.parametrize(
    ("array", "wording"),
    [
        ("", "1 to 1024 characters"),
        ("0-", "is not an index or range"),
        ("5-1", "ends before it starts"),
        ("0-9:0", "step"),
        ("0-9%0", "throttle"),
        ("a,b", "is not an index or range"),
        ("0-3000000000", "above"),
    ],
)
async def test_bad_array_syntax_is_a_422_naming_the_field(
    world: ApiWorld, array: str, wording: str
) -> None:
    """Each malformed `array` is refused with a problem naming `array`; nothing is written."""
    body = problem(await submit(world, world.alice, array), 422, "validation-error")
    assert any(e["field"].endswith("array") and wording in e["message"] for e in body["errors"])
    assert await all_sessions(world, world.alice) == []


async def test_an_array_above_the_manager_limit_is_refused(world: ApiWorld) -> None:
    """More elements than `max_array_size`: 422 on `array` saying the limit; nothing written."""
    world.cluster.controller.max_array_size = 10
    body = problem(await submit(world, world.alice, "0-10"), 422, "validation-error")
    assert body["errors"] == [
        {
            "field": "array",
            "message": "'0-10' has 11 elements; an array may have at most 10 "
            "(the manager's max_array_size); split it",
        }
    ]
    assert (await submit(world, world.alice, "0-9")).status_code == 201
    huge = problem(await submit(world, world.alice, "0-2000000000"), 422, "validation-error")
    assert "2000000001 elements" in huge["errors"][0]["message"]


async def test_an_array_with_an_invalid_reference_writes_no_element(world: ApiWorld) -> None:
    """A dependency on another user's session refuses the whole array: no element exists."""
    bobs = (await create(world, world.bob)).json()["id"]
    body = problem(
        await submit(world, world.alice, "0-99", dependencies=[bobs]), 422, "validation-error"
    )
    assert body["errors"][0]["field"] == "dependencies"
    assert await all_sessions(world, world.alice) == []


async def test_a_failure_after_the_elements_are_written_rolls_every_one_back(
    world: ApiWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The elements, their kernels and events are one transaction: a failure at its last write
    (the events, after every session row went in) leaves no element behind."""
    real = controller_module.append_events

    async def failing(*args: Any, **kwargs: Any) -> Any:
        await real(*args, **kwargs)
        raise RuntimeError("the connection dropped")

    monkeypatch.setattr(controller_module, "append_events", failing)
    with pytest.raises(RuntimeError, match="the connection dropped"):
        await submit(world, world.alice, "0-49")
    monkeypatch.setattr(controller_module, "append_events", real)
    assert await all_sessions(world, world.alice) == []
    assert (await submit(world, world.alice, "0-49")).status_code == 201
    assert (
        len(
            await elements(
                world, world.alice, (await all_sessions(world, world.alice))[0]["array_id"]
            )
        )
        == 50
    )


async def test_terminating_an_array_ends_every_element_and_only_its_owner_may(
    world: ApiWorld,
) -> None:
    """Another user gets 404 and changes nothing; the owner cancels all pending elements;
    an admin may terminate anyone's array."""
    array_id = (await submit(world, world.alice, "0-4")).json()["id"]
    other = (await submit(world, world.alice, "0-1")).json()["id"]
    refused = await world.http.post(f"/v1/arrays/{array_id}/terminate", headers=world.bob.headers)
    problem(refused, 404, "array-not-found")
    assert await elements(world, world.bob, array_id) == []
    done = await world.http.post(f"/v1/arrays/{array_id}/terminate", headers=world.alice.headers)
    assert done.status_code == 200, done.text
    assert done.json() == {
        "id": array_id,
        "number": 1,
        "outcome": "cancelled",
        "cancelled": 5,
        "terminating": 0,
        "unchanged": 0,
    }
    assert {s["status"] for s in await elements(world, world.alice, array_id)} == {"CANCELLED"}
    assert {s["status"] for s in await elements(world, world.alice, other)} == {"PENDING"}
    by_admin = await world.http.post(f"/v1/arrays/{other}/terminate", headers=world.admin.headers)
    assert by_admin.json()["cancelled"] == 2


async def test_array_routes_need_a_valid_token(world: ApiWorld) -> None:
    """Submitting and terminating an array without a valid token are 401 problems."""
    array_id = (await submit(world, world.alice, "0-1")).json()["id"]
    for url in ("/v1/arrays", f"/v1/arrays/{array_id}/terminate"):
        anonymous = await world.http.post(url, json={**BODY, "array": "0-1"})
        problem(anonymous, 401, "unauthenticated")


async def test_an_array_is_named_by_its_number_and_an_element_as_number_underscore_index(
    world: ApiWorld,
) -> None:
    """The array's number is its first element's: `GET /v1/arrays/N` shows it whole (also by
    name); `/v1/sessions/N_I` is element I; `/v1/sessions/N` is a 409 naming the array, and
    another user finds neither; an unnamed index is 404."""
    body = (await submit(world, world.alice, "2-4%1", name="grid")).json()
    number = body["number"]
    first = await world.http.get(f"/v1/sessions/{body['id']}", headers=world.alice.headers)
    assert first.json()["number"] == number and first.json()["array_number"] == number
    whole = await world.http.get(f"/v1/arrays/{number}", headers=world.alice.headers)
    assert whole.status_code == 200, whole.text
    view = whole.json()
    assert (view["id"], view["count"], view["throttle"]) == (body["id"], 3, 1)
    assert view["statuses"] == {"PENDING": 3} and view["results"] == {}
    assert [e["index"] for e in view["elements"]] == [2, 3, 4]
    by_name = await world.http.get("/v1/arrays/grid", headers=world.alice.headers)
    assert by_name.json()["number"] == number

    element = await world.http.get(f"/v1/sessions/{number}_3", headers=world.alice.headers)
    assert element.status_code == 200, element.text
    assert (element.json()["array_index"], element.json()["id"]) == (
        3,
        body["elements"][1]["session_id"],
    )
    refused = problem(
        await world.http.get(f"/v1/sessions/{number}", headers=world.alice.headers),
        409,
        "session-ref-is-array",
    )
    assert f"like {number}_2" in refused["detail"]
    assert refused["array"] == {"id": body["id"], "number": number}
    problem(
        await world.http.get(f"/v1/sessions/{number}_9", headers=world.alice.headers),
        404,
        "session-not-found",
    )
    for url in (f"/v1/sessions/{number}_3", f"/v1/arrays/{number}"):
        hidden = await world.http.get(url, headers=world.bob.headers)
        assert hidden.status_code == 404, url


async def test_removing_an_array_is_all_or_nothing(world: ApiWorld) -> None:
    """`DELETE /v1/arrays/N` refuses while an element has not ended (nothing removed), then
    removes every element once all ended."""
    body = (await submit(world, world.alice, "0-2")).json()
    number = body["number"]
    cancelled = await world.http.post(
        f"/v1/sessions/{number}_0/terminate", headers=world.alice.headers
    )
    assert cancelled.json()["outcome"] == "cancelled"
    refused = await world.http.delete(f"/v1/arrays/{number}", headers=world.alice.headers)
    body_refused = problem(refused, 409, "session-not-ended")
    assert "2 of the 3 sessions of job array" in body_refused["detail"]
    assert len(await elements(world, world.alice, body["id"])) == 3
    await world.http.post(f"/v1/arrays/{number}/terminate", headers=world.alice.headers)
    removed = await world.http.delete(f"/v1/arrays/{number}", headers=world.alice.headers)
    assert removed.json() == {"id": body["id"], "number": number, "removed": 3}
    assert await elements(world, world.alice, body["id"]) == []


async def test_a_dependency_on_a_whole_array_waits_for_every_element(world: ApiWorld) -> None:
    """`{"session": ARRAY_ID, "array": true}` becomes one afterok dependency per element; an
    unknown array and afternotok on an array are 422 naming `dependencies`."""
    body = (await submit(world, world.alice, "0-2")).json()
    after = await create(
        world,
        world.alice,
        dependencies=[{"session": body["id"], "kind": "afterany", "array": True}],
    )
    assert after.status_code == 201, after.text
    async with world.cluster.db.read() as conn:
        rows = await conn.execute(
            sa.select(session_dependencies.c.depends_on, session_dependencies.c.kind).where(
                session_dependencies.c.session_id == uuid.UUID(after.json()["id"])
            )
        )
        assert sorted((str(d), k) for d, k in rows) == sorted(
            (e["session_id"], "afterany") for e in body["elements"]
        )
    bob = await create(world, world.bob, dependencies=[{"session": body["id"], "array": True}])
    assert "dependencies" in str(problem(bob, 422, "validation-error")["errors"])
    notok = await create(
        world,
        world.alice,
        dependencies=[{"session": body["id"], "kind": "afternotok", "array": True}],
    )
    assert "afternotok" in problem(notok, 422, "validation-error")["detail"]
