"""Agents, resource groups, users and tokens over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from corral.api.app import ApiContext, create_app
from corral.api.problems import PROBLEM_BASE, PROBLEM_MEDIA_TYPE
from corral.domain.status import SessionStatus
from corral.domain.types import AgentId
from corral.store.agents import NewAgent, insert_agents
from tests.integration.api.conftest import ApiWorld
from tests.integration.store._factories import NOW, add_agents

ANY_ID = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
async def http(world: ApiWorld) -> AsyncIterator[httpx.AsyncClient]:
    """A client on an app over the world's context, with the admin routes."""
    context = ApiContext(
        db=world.cluster.db,
        agents=world.agents,
        sessions=world.cluster.controller,
        events=world.cluster.events,
    )
    transport = httpx.ASGITransport(app=create_app(context))
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as client:
        yield client


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """The response's problem document, after checking its status, media type and slug."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_MEDIA_TYPE)
    body: dict[str, Any] = response.json()
    assert body["type"] == PROBLEM_BASE + slug, body
    assert body["status"] == status
    return body


async def walk(
    http: httpx.AsyncClient, path: str, headers: dict[str, str], limit: int
) -> list[dict[str, Any]]:
    """Every item of a list, following `next_cursor` page by page."""
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    for _ in range(100):
        response = await http.get(path, params=params, headers=headers)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["items"]) <= limit
        items += page["items"]
        if page["next_cursor"] is None:
            return items
        params["cursor"] = page["next_cursor"]
    raise AssertionError(f"{path}: the cursor never ended")


# (method, path, body, admin only)
ROUTES: list[tuple[str, str, dict[str, Any] | None, bool]] = [
    ("GET", "/v1/agents", None, False),
    ("GET", "/v1/agents/nope", None, False),
    ("POST", "/v1/agents/nope/drain", None, True),
    ("POST", "/v1/agents/nope/undrain", None, True),
    ("DELETE", "/v1/agents/nope", None, True),
    ("GET", "/v1/resource-groups", None, False),
    ("GET", "/v1/resource-groups/default", None, False),
    ("POST", "/v1/resource-groups", {"name": "gpu"}, True),
    ("PATCH", "/v1/resource-groups/default", {"description": "d"}, True),
    ("DELETE", "/v1/resource-groups/gpu", None, True),
    ("GET", "/v1/users", None, True),
    ("POST", "/v1/users", {"name": "carol"}, True),
    ("PATCH", "/v1/users/bob", {"role": "admin"}, True),
    ("DELETE", "/v1/users/bob", None, True),
    # Anyone's own tokens; another user's (bob's, to alice) only an admin's.
    ("GET", "/v1/users/alice/tokens", None, False),
    ("POST", "/v1/users/alice/tokens", {"name": "ci"}, False),
    ("GET", "/v1/users/bob/tokens", None, True),
    ("POST", "/v1/users/bob/tokens", {"name": "ci"}, True),
    ("DELETE", f"/v1/tokens/{ANY_ID}", None, False),
    ("GET", "/v1/me", None, False),
    ("GET", "/v1/events?follow=false", None, False),
]


@pytest.mark.parametrize(("method", "path", "body", "admin_only"), ROUTES)
async def test_every_route_needs_a_token_and_admin_routes_an_admin(
    world: ApiWorld,
    http: httpx.AsyncClient,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    admin_only: bool,
) -> None:
    """No token and a bad token are 401; a user on an admin route is 403; all as problems."""
    for headers in ({}, {"Authorization": "Bearer crl_not-a-token"}):
        response = await http.request(method, path, json=body, headers=headers)
        problem(response, 401, "unauthenticated")
    response = await http.request(method, path, json=body, headers=world.alice.headers)
    if admin_only:
        problem(response, 403, "forbidden")
    else:
        assert response.status_code not in (401, 403), response.text


async def test_agents_list_shows_slots_as_numbers_in_base_units(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """An agent's capacity is the slots' JSON form (cores, bytes); idle, it holds nothing."""
    (agent_id,) = world.cluster.agents
    response = await http.get("/v1/agents", headers=world.alice.headers)
    assert response.status_code == 200, response.text
    (agent,) = response.json()["items"]
    assert agent["id"] == agent_id
    assert agent["status"] == "ALIVE" and agent["schedulable"] is True
    assert agent["capacity"] == {"cpu": 8, "mem": 16 * 1024**3}
    assert (agent["occupied"], agent["kernels"]) == ({}, 0)
    one = await http.get(f"/v1/agents/{agent_id}", headers=world.alice.headers)
    assert one.json() == agent


async def test_agents_filter_by_status_and_resource_group(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """`status` and `resource_group` keep only the agents that match."""
    for params, count in (
        ({"status": "ALIVE"}, 1),
        ({"status": "LOST"}, 0),
        ({"resource_group": "default"}, 1),
        ({"resource_group": "gpu"}, 0),
    ):
        response = await http.get("/v1/agents", params=params, headers=world.bob.headers)
        assert len(response.json()["items"]) == count, params
    bad = await http.get("/v1/agents", params={"status": "asleep"}, headers=world.bob.headers)
    assert problem(bad, 422, "validation-error")["errors"][0]["field"] == "status"


async def test_agents_pages_walk_every_agent_once(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """Following `next_cursor` lists every agent exactly once, in id order."""
    await add_agents(world.cluster.db, [{"cpu": 1000}] * 6)
    items = await walk(http, "/v1/agents", world.alice.headers, limit=3)
    ids = [a["id"] for a in items]
    assert len(ids) == 7 and ids == sorted(set(ids))


async def test_unknown_agent_is_a_404_problem(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """Getting or draining an agent that does not exist names it in a 404 problem."""
    body = problem(
        await http.get("/v1/agents/ghost", headers=world.alice.headers), 404, "agent-not-found"
    )
    assert "ghost" in body["detail"]
    drain = await http.post("/v1/agents/ghost/drain", headers=world.admin.headers)
    problem(drain, 404, "agent-not-found")


async def test_drained_agent_gets_no_kernels_until_undrained(
    world: ApiWorld, http: httpx.AsyncClient
) -> None:
    """The scheduler skips a drained agent; undrained, it takes the waiting session."""
    (agent_id,) = world.cluster.agents
    for _ in range(2):  # idempotent
        drained = await http.post(f"/v1/agents/{agent_id}/drain", headers=world.admin.headers)
        assert drained.status_code == 200 and drained.json()["schedulable"] is False
    sid = await world.cluster.submit()
    await world.cluster.coordinator.run_all()
    assert await world.cluster.status(sid) is SessionStatus.PENDING
    undrained = await http.post(f"/v1/agents/{agent_id}/undrain", headers=world.admin.headers)
    assert undrained.json()["schedulable"] is True
    await world.cluster.coordinator.run_all()
    assert await world.cluster.status(sid) is not SessionStatus.PENDING
    agent = (await http.get(f"/v1/agents/{agent_id}", headers=world.bob.headers)).json()
    assert (agent["occupied"], agent["kernels"]) == ({"cpu": 1}, 1)
    page = await http.get("/v1/events?follow=false", headers=world.admin.headers)
    kinds = [e["kind"] for e in page.json()["items"] if e["entity_type"] == "agent"]
    assert kinds == ["agent.drained", "agent.undrained"]


async def test_resource_groups_crud(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """Admins create, change and delete a group; users read it; options show their defaults."""
    admin, alice = world.admin.headers, world.alice.headers
    body = {"name": "gpu", "description": "A100s", "options": {"sequencer": "drf"}}
    created = await http.post("/v1/resource-groups", json=body, headers=admin)
    assert created.status_code == 201, created.text
    assert created.json()["options"]["sequencer"] == "drf"
    assert created.json()["options"]["selector"] == "concentrated"
    again = await http.post("/v1/resource-groups", json=body, headers=admin)
    problem(again, 409, "resource-group-exists")
    patch = {
        "options": {"ordering": "best_effort", "phase_limits": {"StartSessions": {"timeout_s": 60}}}
    }
    patched = await http.patch("/v1/resource-groups/gpu", json=patch, headers=admin)
    assert patched.status_code == 200, patched.text
    options = patched.json()["options"]
    assert (options["sequencer"], options["ordering"]) == ("drf", "best_effort")
    reset = {"options": {"sequencer": None}, "description": "H100s"}
    patched = await http.patch("/v1/resource-groups/gpu", json=reset, headers=admin)
    assert patched.json()["options"]["sequencer"] == "fifo"
    assert patched.json()["options"]["phase_limits"] == {
        "StartSessions": {"max_attempts": None, "timeout_s": 60.0}
    }
    got = await http.get("/v1/resource-groups/gpu", headers=alice)
    assert got.json() == patched.json() and got.json()["description"] == "H100s"
    assert (await http.delete("/v1/resource-groups/gpu", headers=admin)).status_code == 204
    problem(
        await http.get("/v1/resource-groups/gpu", headers=alice), 404, "resource-group-not-found"
    )
    problem(
        await http.delete("/v1/resource-groups/gpu", headers=admin), 404, "resource-group-not-found"
    )


async def test_group_slot_limits_read_as_numbers(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """A group's max_slots_per_owner, given as quantities, reads back in the slots' JSON form."""
    options = {"max_slots_per_owner": {"cpu": "1500m", "mem": "4G"}}
    created = await http.post(
        "/v1/resource-groups", json={"name": "g", "options": options}, headers=world.admin.headers
    )
    assert created.status_code == 201, created.text
    expected = {"cpu": 1.5, "mem": 4 * 10**9}
    assert created.json()["options"]["max_slots_per_owner"] == expected
    got = await http.get("/v1/resource-groups/g", headers=world.alice.headers)
    assert got.json()["options"]["max_slots_per_owner"] == expected
    bad = await http.patch(
        "/v1/resource-groups/g",
        json={"options": {"max_slots_per_owner": {"cpu": "-1"}}},
        headers=world.admin.headers,
    )
    assert problem(bad, 422, "validation-error")["errors"] == [
        {"field": "options.max_slots_per_owner.cpu", "message": "must not be negative (got -1)"}
    ]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"sequencer": "random"}, "options.sequencer"),
        ({"max_sessions_per_owner": 0}, "options.max_sessions_per_owner"),
        ({"phase_limits": {"Nap": {"timeout_s": 1}}}, "options.phase_limits"),
        ({"colour": "blue"}, "options.colour"),
    ],
)
async def test_bad_option_is_a_422_naming_the_field(
    world: ApiWorld, http: httpx.AsyncClient, options: dict[str, Any], field: str
) -> None:
    """A bad option, created or merged in, is refused naming its field; nothing changes."""
    admin = world.admin.headers
    created = await http.post(
        "/v1/resource-groups", json={"name": "g", "options": options}, headers=admin
    )
    assert field in {e["field"] for e in problem(created, 422, "validation-error")["errors"]}
    patched = await http.patch(
        "/v1/resource-groups/default", json={"options": options}, headers=admin
    )
    body = problem(patched, 422, "validation-error")
    assert field in {e["field"] for e in body["errors"]} and field in body["detail"]
    default = await http.get("/v1/resource-groups/default", headers=admin)
    assert default.json()["options"]["sequencer"] == "fifo"


async def test_group_in_use_cannot_be_deleted(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """`default`, a group with agents, with live sessions or named by ended ones stay (409)."""
    admin = world.admin.headers
    problem(
        await http.delete("/v1/resource-groups/default", headers=admin),
        409,
        "resource-group-protected",
    )
    for name in ("with-agent", "with-session"):
        await http.post("/v1/resource-groups", json={"name": name}, headers=admin)
    agent = NewAgent(AgentId("gpu-1"), "10.0.9.1", {"cpu": 1000}, resource_group="with-agent")
    await insert_agents(world.cluster.db, [agent], NOW)
    response = await http.delete("/v1/resource-groups/with-agent", headers=admin)
    problem(response, 409, "resource-group-has-agents")
    sid = await world.cluster.submit(resource_group="with-session")
    response = await http.delete("/v1/resource-groups/with-session", headers=admin)
    problem(response, 409, "resource-group-has-sessions")
    await world.cluster.controller.mark_terminate([sid], "test")
    assert await world.cluster.status(sid) is SessionStatus.CANCELLED
    response = await http.delete("/v1/resource-groups/with-session", headers=admin)
    problem(response, 409, "resource-group-in-use")


async def test_resource_group_pages_and_cursors(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """Pages of groups walk every group once; a cursor of another list is refused."""
    for i in range(5):
        await http.post("/v1/resource-groups", json={"name": f"g{i}"}, headers=world.admin.headers)
    names = [g["name"] for g in await walk(http, "/v1/resource-groups", world.bob.headers, 2)]
    assert names == ["default", "g0", "g1", "g2", "g3", "g4"]
    users_page = await http.get("/v1/users", params={"limit": 1}, headers=world.admin.headers)
    foreign = users_page.json()["next_cursor"]
    for cursor in (foreign, "not-a-cursor", "e30"):
        response = await http.get(
            "/v1/resource-groups", params={"cursor": cursor}, headers=world.bob.headers
        )
        problem(response, 422, "invalid-cursor")
    too_many = await http.get(
        "/v1/resource-groups", params={"limit": 1001}, headers=world.bob.headers
    )
    assert problem(too_many, 422, "validation-error")["errors"][0]["field"] == "limit"


async def test_users_and_tokens(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """An admin creates a user and a token; the token works until it is revoked, at once."""
    admin = world.admin.headers
    created = await http.post("/v1/users", json={"name": "carol", "role": "user"}, headers=admin)
    assert created.status_code == 201, created.text
    assert (created.json()["name"], created.json()["role"]) == ("carol", "user")
    problem(await http.post("/v1/users", json={"name": "carol"}, headers=admin), 409, "user-exists")
    bad_role = await http.post("/v1/users", json={"name": "dave", "role": "root"}, headers=admin)
    assert problem(bad_role, 422, "validation-error")["errors"][0]["field"] == "role"
    issued = await http.post(
        "/v1/users/carol/tokens", json={"name": "laptop", "expires_in_s": 3600}, headers=admin
    )
    assert issued.status_code == 201, issued.text
    token = issued.json()
    assert token["token"].startswith("crl_") and token["expires_at"] is not None
    carol = {"Authorization": f"Bearer {token['token']}"}
    me = (await http.get("/v1/me", headers=carol)).json()
    assert (me["name"], me["role"], me["id"]) == ("carol", "user", created.json()["id"])
    listed = (await http.get("/v1/users/carol/tokens", headers=admin)).json()["items"]
    assert [t["id"] for t in listed] == [token["id"]] and "token" not in listed[0]
    assert (await http.delete(f"/v1/tokens/{token['id']}", headers=admin)).status_code == 204
    problem(await http.get("/v1/me", headers=carol), 401, "unauthenticated")
    problem(await http.delete(f"/v1/tokens/{token['id']}", headers=admin), 404, "token-not-found")
    ghost = await http.post("/v1/users/ghost/tokens", json={"name": "x"}, headers=admin)
    problem(ghost, 404, "user-not-found")


async def test_users_pages_walk_every_user_once(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """Following `next_cursor` lists every user exactly once, by name."""
    for i in range(4):
        await http.post("/v1/users", json={"name": f"user{i}"}, headers=world.admin.headers)
    names = [u["name"] for u in await walk(http, "/v1/users", world.admin.headers, limit=2)]
    assert names == sorted(set(names))
    assert {"root", "alice", "bob", "user0", "user3"} <= set(names) and len(names) == 8


async def test_me_says_who_calls(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """`GET /v1/me` answers the caller's id, name and role."""
    me = (await http.get("/v1/me", headers=world.admin.headers)).json()
    assert me == {"id": str(world.admin.user.user_id), "name": "root", "role": "admin"}
    assert uuid.UUID(me["id"])


async def test_openapi_describes_the_routes(world: ApiWorld, http: httpx.AsyncClient) -> None:
    """The schema builds and documents every route, the event stream's media types too."""
    schema = (await http.get("/openapi.json")).json()
    for method, path in (
        ("get", "/v1/agents"),
        ("post", "/v1/agents/{agent_id}/drain"),
        ("patch", "/v1/resource-groups/{name}"),
        ("delete", "/v1/tokens/{token_id}"),
        ("get", "/v1/me"),
    ):
        assert method in schema["paths"][path], path
    content = schema["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]
    assert {"text/event-stream", "application/json"} <= set(content)
