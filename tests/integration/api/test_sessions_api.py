"""`/v1/sessions` over HTTP (the real app in-process), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from corral.domain.slots import ResourceSlots
from corral.domain.types import KernelId, SessionId
from corral.store.kernel_logs import LogChunk, append_log_chunks
from tests.integration.api.conftest import ApiWorld, Caller

BODY = {"image": "python", "command": ["python", "-c", "print(1)"], "resources": {"cpu": 1}}


async def create(world: ApiWorld, caller: Caller, **fields: Any) -> httpx.Response:
    return await world.http.post("/v1/sessions", json={**BODY, **fields}, headers=caller.headers)


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """The response is a problem-details document with this status and type."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"].endswith("/" + slug)
    assert body["status"] == status
    return body


async def test_every_route_needs_a_valid_token(world: ApiWorld) -> None:
    """No token and an unknown token are both 401 problems, on reads and writes."""
    sid = (await create(world, world.alice)).json()["id"]
    for method, url in (
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions"),
        ("GET", f"/v1/sessions/{sid}"),
        ("POST", f"/v1/sessions/{sid}/terminate"),
        ("GET", f"/v1/sessions/{sid}/logs"),
        ("GET", f"/v1/sessions/{sid}/history"),
        ("DELETE", f"/v1/sessions/{sid}"),
    ):
        anonymous = await world.http.request(method, url, json=BODY)
        problem(anonymous, 401, "unauthenticated")
        forged = await world.http.request(
            method, url, json=BODY, headers={"Authorization": "Bearer crl_forged"}
        )
        problem(forged, 401, "unauthenticated")


async def test_create_returns_the_session_and_is_idempotent_on_creation_id(
    world: ApiWorld,
) -> None:
    """201 with the session and its kernels; the same creation_id again is 200, same id."""
    first = await create(world, world.alice, creation_id="job-1", cluster_size=2)
    assert first.status_code == 201, first.text
    body = first.json()
    assert (body["owner"], body["status"], body["image"]) == ("alice", "PENDING", "python")
    assert body["resources"] == {"cpu": 1}
    assert [k["cluster_index"] for k in body["kernels"]] == [0, 1]
    again = await create(world, world.alice, creation_id="job-1", cluster_size=2)
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    other_owner = await create(world, world.bob, creation_id="job-1")
    assert other_owner.status_code == 201
    assert other_owner.json()["id"] != body["id"]


async def test_the_same_creation_id_with_another_request_is_409_naming_what_differs(
    world: ApiWorld,
) -> None:
    """Stripe's rule: a key names one request. Another body under it is 409 naming the fields
    that differ, writes nothing, and the same request (however spelled) is still 200."""
    first = await create(world, world.alice, creation_id="job-9", env={"A": "1"})
    assert first.status_code == 201, first.text
    changed = await create(
        world, world.alice, creation_id="job-9", env={"A": "2"}, priority=5, command=["false"]
    )
    body = problem(changed, 409, "creation-id-conflict")
    assert body["fields"] == ["command", "env", "priority"]
    assert body["session_id"] == first.json()["id"]
    assert "job-9" in body["detail"] and "command, env, priority differ" in body["detail"]
    # The same request spelled otherwise: a quantity string, a default given explicitly.
    same = await create(
        world,
        world.alice,
        creation_id="job-9",
        env={"A": "1"},
        resources={"cpu": "1000m"},
        priority=0,
        type="BATCH",
    )
    assert (same.status_code, same.json()["id"]) == (200, first.json()["id"])
    listed = await world.http.get("/v1/sessions", headers=world.alice.headers)
    assert [s["id"] for s in listed.json()["items"]] == [first.json()["id"]]


async def test_a_kernel_asking_more_than_max_kernel_slots_is_422(world: ApiWorld) -> None:
    """The manager's per-slot maximum refuses a kernel asking more (naming the slot); slots it
    does not name, and requests within it, pass."""
    world.cluster.controller.max_kernel_slots = ResourceSlots({"cpu": 4, "mem": "8Gi"})
    over = await create(world, world.alice, resources={"cpu": 2, "mem": "9Gi"})
    body = problem(over, 422, "validation-error")
    assert [e["field"] for e in body["errors"]] == ["resources.mem"]
    assert "max_kernel_slots" in body["detail"]
    within = await create(world, world.alice, resources={"cpu": 4, "mem": "8Gi", "gpu": 8})
    assert within.status_code == 201, within.text


async def test_the_created_session_is_answered_as_a_read_shows_it(world: ApiWorld) -> None:
    """The create answer (built from what was written) is what a GET then reads back."""
    created = await create(
        world, world.alice, name="train", cluster_size=2, priority=-5, env={"A": "1"}
    )
    assert created.status_code == 201, created.text
    body = created.json()
    read = await world.http.get(f"/v1/sessions/{body['id']}", headers=world.alice.headers)
    assert read.status_code == 200
    assert body == read.json()
    again = await create(world, world.alice, creation_id="twice")
    repeated = await create(world, world.alice, creation_id="twice")
    assert (again.status_code, repeated.status_code) == (201, 200)
    assert repeated.json() == again.json()


async def test_bad_specs_are_422_naming_the_field_and_write_nothing(world: ApiWorld) -> None:
    """A bad field, or a resource group that does not exist, names the field; nothing stored."""
    bad_cpu = await create(world, world.alice, resources={"cpu": "-1"})
    assert problem(bad_cpu, 422, "validation-error")["errors"] == [
        {"field": "resources.cpu", "message": "must not be negative (got -1)"}
    ]
    no_group = await create(world, world.alice, resource_group="nowhere")
    assert problem(no_group, 422, "validation-error")["errors"][0]["field"] == "resource_group"
    page = await world.http.get("/v1/sessions", headers=world.alice.headers)
    assert page.json()["items"] == []


async def test_resources_read_as_numbers_in_base_units(world: ApiWorld) -> None:
    """Quantity strings in, the JSON form out: cpu in cores, mem in bytes, in create, get, list."""
    created = await create(
        world, world.alice, resources={"cpu": "500m", "mem": "4Gi", "cuda.device": 1}
    )
    assert created.status_code == 201, created.text
    expected = {"cpu": 0.5, "mem": 4 * 1024**3, "cuda.device": 1}
    assert created.json()["resources"] == expected
    read = await world.http.get(f"/v1/sessions/{created.json()['id']}", headers=world.alice.headers)
    assert read.json()["resources"] == expected
    legacy = await create(world, world.alice, resources="cpu=1.5,mem=512m")
    assert legacy.json()["resources"] == {"cpu": 1.5, "mem": 512 * 1024**2}
    decimal = await create(world, world.alice, resources={"cpu": 2, "mem": "4G"})
    assert decimal.json()["resources"] == {"cpu": 2, "mem": 4 * 10**9}
    listed = await world.http.get("/v1/sessions", headers=world.alice.headers)
    assert [s["resources"] for s in listed.json()["items"]] == [
        {"cpu": 2, "mem": 4 * 10**9},
        {"cpu": 1.5, "mem": 512 * 1024**2},
        expected,
    ]


async def test_invalid_fields_are_worded_by_corral_not_pydantic(world: ApiWorld) -> None:
    """422 details say `field: must ...`: no `Value error,`, no `Input should`, no `body.`."""
    bad = await create(
        world, world.alice, priority=500, cluster_size=0, colour="blue", resources={"mem": "4x"}
    )
    body = problem(bad, 422, "validation-error")
    assert {e["field"]: e["message"] for e in body["errors"]} == {
        "priority": "must be 100 or less",
        "cluster_size": "must be 1 or more",
        "colour": "is not a known field; check its spelling",
        "resources.mem": body["errors"][0]["message"],
    }
    assert body["errors"][0]["message"].startswith("unknown unit 'x' in '4x'; mem takes bytes")
    for text in ("Value error", "Input should", "body."):
        assert text not in body["detail"]
    assert body["detail"].startswith("resources.mem: unknown unit 'x'")
    no_image = await world.http.post(
        "/v1/sessions", json={"command": ["true"]}, headers=world.alice.headers
    )
    assert problem(no_image, 422, "validation-error")["detail"] == "image: is required"


async def test_openapi_documents_the_slot_json_form(world: ApiWorld) -> None:
    """The OpenAPI document: sessions' resources out as numbers, in as numbers or quantities."""
    document = (await world.http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    output = schemas["SessionOut"]["properties"]["resources"]
    assert output["type"] == "object"
    assert output["additionalProperties"] == {"type": "number", "minimum": 0}
    assert "mem in bytes" in output["description"]
    spec = next(v for k, v in schemas.items() if k.startswith("SessionSpec"))
    accepted = spec["properties"]["resources"]
    assert {option["type"] for option in accepted["anyOf"]} == {"object", "string"}
    assert "Kubernetes quantity" in accepted["description"]


async def test_users_see_only_their_own_sessions_and_admins_see_all(world: ApiWorld) -> None:
    """Bob gets 404 for Alice's session on every route; the admin sees and lists both."""
    alice_sid = (await create(world, world.alice)).json()["id"]
    bob_sid = (await create(world, world.bob)).json()["id"]
    for method, suffix in (
        ("GET", ""),
        ("POST", "/terminate"),
        ("GET", "/logs"),
        ("GET", "/history"),
        ("GET", "/explain"),
        ("DELETE", ""),
    ):
        refused = await world.http.request(
            method, f"/v1/sessions/{alice_sid}{suffix}", headers=world.bob.headers
        )
        problem(refused, 404, "session-not-found")
    bobs = await world.http.get("/v1/sessions", headers=world.bob.headers)
    assert [s["id"] for s in bobs.json()["items"]] == [bob_sid]
    everyone = await world.http.get("/v1/sessions", headers=world.admin.headers)
    assert {s["id"] for s in everyone.json()["items"]} == {alice_sid, bob_sid}
    only_alice = await world.http.get(
        "/v1/sessions", params={"owner": "alice"}, headers=world.admin.headers
    )
    assert [s["id"] for s in only_alice.json()["items"]] == [alice_sid]
    asked = await world.http.get(
        "/v1/sessions", params={"owner": "alice"}, headers=world.bob.headers
    )
    problem(asked, 403, "forbidden")
    admin_get = await world.http.get(f"/v1/sessions/{alice_sid}", headers=world.admin.headers)
    assert admin_get.status_code == 200


async def test_pages_walk_every_session_once_newest_first(world: ApiWorld) -> None:
    """limit + next_cursor visit all sessions exactly once; a forged cursor is a 422."""
    made = []
    for i in range(7):
        world.cluster.clock.advance(1)  # distinct submission times: a defined order
        made.append((await create(world, world.alice, name=f"s{i}")).json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = await world.http.get("/v1/sessions", params=params, headers=world.alice.headers)
        seen += [s["id"] for s in page.json()["items"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made) and len(seen) == 7
    assert seen == sorted(seen, key=made.index, reverse=True)
    forged = await world.http.get(
        "/v1/sessions", params={"cursor": "garbage"}, headers=world.alice.headers
    )
    problem(forged, 422, "invalid-cursor")
    pending = await world.http.get(
        "/v1/sessions", params={"status": "RUNNING"}, headers=world.alice.headers
    )
    assert pending.json()["items"] == []


async def test_terminate_twice_and_remove_only_when_ended(world: ApiWorld) -> None:
    """Terminate cancels a pending session, then is a no-op; remove: 409 before the end, 204."""
    sid = (await create(world, world.alice)).json()["id"]
    url = f"/v1/sessions/{sid}"
    running = (await create(world, world.alice)).json()["id"]
    await world.cluster.settle()
    removed_early = await world.http.delete(f"/v1/sessions/{running}", headers=world.alice.headers)
    problem(removed_early, 409, "session-not-ended")
    first = await world.http.post(f"{url}/terminate", headers=world.alice.headers)
    assert first.json()["outcome"] in ("cancelled", "terminating")
    await world.cluster.settle()
    second = await world.http.post(f"{url}/terminate", headers=world.alice.headers)
    assert second.json()["outcome"] == "unchanged"
    ended = (await world.http.get(url, headers=world.alice.headers)).json()["status"]
    assert ended in ("CANCELLED", "TERMINATED")
    assert (await world.http.delete(url, headers=world.alice.headers)).status_code == 204
    problem(await world.http.get(url, headers=world.alice.headers), 404, "session-not-found")


async def test_logs_history_and_explain_of_a_session(world: ApiWorld) -> None:
    """Logs by kernel and stream, the history of its phases, the scheduler's explanation."""
    sid = (await create(world, world.alice)).json()["id"]
    explained = await world.http.get(f"/v1/sessions/{sid}/explain", headers=world.alice.headers)
    assert explained.json()["status"] == "PENDING"
    await world.cluster.settle()
    session = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert session["status"] == "RUNNING"
    kernel = session["kernels"][0]
    await append_log_chunks(
        world.cluster.db,
        kernel["agent_id"],
        [LogChunk(KernelId(uuid.UUID(kernel["id"])), "stdout", 0, b"hello\n")],
        world.cluster.clock(),
    )
    logs = await world.http.get(f"/v1/sessions/{sid}/logs", headers=world.alice.headers)
    assert logs.content == b"hello\n"
    tail = await world.http.get(
        f"/v1/sessions/{sid}/logs", params={"offset": 2}, headers=world.alice.headers
    )
    assert tail.content == b"llo\n"
    missing = await world.http.get(
        f"/v1/sessions/{sid}/logs", params={"kernel": 5}, headers=world.alice.headers
    )
    problem(missing, 404, "kernel-not-found")
    history = await world.http.get(f"/v1/sessions/{sid}/history", headers=world.alice.headers)
    phases = [(h["phase"], h["to_status"]) for h in history.json()["items"]]
    assert ("ScheduleNewSessions", "SCHEDULED") in phases
    assert ("PromoteToRunning", "RUNNING") in phases
    await world.cluster.agent.exit([KernelId(uuid.UUID(kernel["id"]))], exit_code=0)
    await world.cluster.settle()
    followed = await world.http.get(
        f"/v1/sessions/{sid}/logs", params={"follow": True}, headers=world.alice.headers
    )
    assert followed.content == b"hello\n"  # the session ended: the stream ends too
    assert SessionId(uuid.UUID(sid))
