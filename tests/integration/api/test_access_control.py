"""Who may submit where: a resource group's users and its max_user_priority, at submission
(403 naming the field, nothing written) and for sessions already queued (they wait, with the
reason in `session ls`), over HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from corral.scheduler.validators import ACCESS_DENIED, PRIORITY_NOT_ALLOWED
from corral.store.tables import sessions
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.api.test_sessions_api import create, problem


async def _options(world: ApiWorld, group: str = "default", **options: Any) -> dict[str, Any]:
    response = await world.http.patch(
        f"/v1/resource-groups/{group}", json={"options": options}, headers=world.admin.headers
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()["options"]
    return body


async def _stored_sessions(world: ApiWorld) -> int:
    async with world.cluster.db.read() as conn:
        return int(await conn.scalar(sa.select(sa.func.count()).select_from(sessions)) or 0)


async def _listed(world: ApiWorld, caller: Caller) -> list[dict[str, Any]]:
    response = await world.http.get(
        "/v1/sessions", params={"reasons": "true"}, headers=caller.headers
    )
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_a_group_open_to_listed_users_refuses_the_others_with_a_403(
    world: ApiWorld,
) -> None:
    """Listed users and admins submit; anyone else gets 403 naming resource_group, and no
    session, array element or kernel is written for them."""
    assert (await _options(world, allowed_users=["alice"]))["allowed_users"] == ["alice"]
    assert (await create(world, world.alice)).status_code == 201
    assert (await create(world, world.admin)).status_code == 201
    refused = await create(world, world.bob)
    body = problem(refused, 403, "forbidden-field")
    assert body["errors"] == [
        {
            "field": "resource_group",
            "message": "resource group 'default' is open to listed users only, and 'bob' is "
            "not one of them; ask an admin for access, or choose another group",
        }
    ]
    array = await world.http.post(
        "/v1/arrays",
        json={"image": "python", "command": ["true"], "array": "0-9"},
        headers=world.bob.headers,
    )
    assert problem(array, 403, "forbidden-field")["errors"][0]["field"] == "resource_group"
    assert await _stored_sessions(world) == 2


async def test_a_priority_above_the_groups_maximum_needs_an_admin(world: ApiWorld) -> None:
    """By default users may lower their priority but not raise it; admins may; a group may
    let users go higher."""
    assert (await create(world, world.alice, priority=-10)).status_code == 201
    refused = await create(world, world.alice, priority=1)
    assert problem(refused, 403, "forbidden-field")["errors"] == [
        {
            "field": "priority",
            "message": "priority 1 is above 0, the max_user_priority of resource group "
            "'default': only admins may submit above it; ask for 0 or less",
        }
    ]
    assert (await create(world, world.admin, priority=100)).status_code == 201
    await _options(world, max_user_priority=10)
    assert (await create(world, world.alice, priority=10)).status_code == 201
    assert problem(await create(world, world.alice, priority=11), 403, "forbidden-field")
    assert await _stored_sessions(world) == 3


async def test_queued_sessions_follow_the_rules_as_they_change(world: ApiWorld) -> None:
    """A session queued before its owner was taken off the group's users, or before the
    group's maximum fell below its priority, is not placed: it waits with the reason, and is
    placed once the rule lets it through again."""
    await _options(world, max_user_priority=5)
    kept_out = (await create(world, world.alice)).json()["id"]
    too_high = (await create(world, world.bob, priority=5)).json()["id"]
    await _options(world, allowed_users=["bob"], max_user_priority=0)
    await world.cluster.settle()

    (alices,) = await _listed(world, world.alice)
    (bobs,) = await _listed(world, world.bob)
    assert (alices["id"], alices["status"], alices["reason"]) == (
        kept_out,
        "PENDING",
        ACCESS_DENIED,
    )
    assert (bobs["id"], bobs["status"], bobs["reason"]) == (
        too_high,
        "PENDING",
        PRIORITY_NOT_ALLOWED,
    )
    explained = await world.http.get(
        f"/v1/sessions/{kept_out}/explain", headers=world.alice.headers
    )
    assert explained.json()["code"] == ACCESS_DENIED
    assert "waits until an admin opens the group to its owner" in explained.json()["message"]

    await _options(world, allowed_users=None, max_user_priority=5)
    await world.cluster.settle()
    statuses = {s["id"]: s["status"] for s in await _listed(world, world.admin)}
    assert statuses[kept_out] not in ("PENDING", "CANCELLED")
    assert statuses[too_high] not in ("PENDING", "CANCELLED")


async def test_options_naming_an_unknown_user_are_refused(world: ApiWorld) -> None:
    """A typo in the users' list is a 422 on options.allowed_users; nothing changes."""
    for method, path, body in (
        ("PATCH", "/v1/resource-groups/default", {"options": {"allowed_users": ["alice", "eve"]}}),
        ("POST", "/v1/resource-groups", {"name": "gpu", "options": {"allowed_users": ["eve"]}}),
    ):
        response = await world.http.request(method, path, json=body, headers=world.admin.headers)
        errors = problem(response, 422, "validation-error")["errors"]
        assert errors == [
            {
                "field": "options.allowed_users",
                "message": "no user is named 'eve'; `corral user ls` lists the users",
            }
        ]
    group = await world.http.get("/v1/resource-groups/default", headers=world.alice.headers)
    assert group.json()["options"]["allowed_users"] is None
    missing = await world.http.get("/v1/resource-groups/gpu", headers=world.alice.headers)
    assert missing.status_code == 404
