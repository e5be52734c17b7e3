"""The dashboard's deployment pages over HTTP, on SQLite and PostgreSQL: the list with status
and replicas, one deployment's routes, and isolation (a plain user never sees another's)."""

from __future__ import annotations

import html
import uuid
from datetime import timedelta
from typing import Any

from corral.domain.status import RouteStatus
from corral.store.deployments import insert_routes, update_routes
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.web.test_dashboard import sign_in

SPEC: dict[str, Any] = {"image": "python", "command": ["python", "serve.py"], "replicas": 2}


async def _deploy(world: ApiWorld, caller: Caller, name: str) -> dict[str, Any]:
    answer = await world.http.post(
        "/v1/deployments", json={**SPEC, "name": name}, headers=caller.headers
    )
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_the_deployments_page_lists_status_and_replicas(world: ApiWorld) -> None:
    """Alice's page lists her deployment with its lifecycle and replicas; its page shows each
    route's status, address, last probe and failures."""
    mine = await _deploy(world, world.alice, "llm")
    route_id = uuid.uuid4()
    now = world.cluster.clock()
    async with world.cluster.db.transaction() as conn:
        await insert_routes(conn, [(route_id, uuid.UUID(mine["id"]), None)], now)
        await update_routes(
            conn,
            {
                route_id: {
                    "status": RouteStatus.UNHEALTHY.value,
                    "host": "10.1.2.3",
                    "port": 40123,
                    "probed_at": now - timedelta(seconds=7),
                    "consecutive_failures": 4,
                    "health_info": "GET /health answered 503",
                }
            },
        )
    alice = await sign_in(world, world.alice)
    listed = await world.http.get("/ui/deployments", headers=alice)
    assert listed.status_code == 200
    assert f'data-deployment="{mine["id"]}"' in listed.text
    assert 'data-lifecycle="pending"' in listed.text
    assert 'data-healthy="0" data-desired="2"' in listed.text
    assert 'href="/ui/deployments"' in listed.text  # the navigation's entry
    for ref in (mine["id"], "llm"):
        page = await world.http.get(f"/ui/deployments/{ref}", headers=alice)
        assert page.status_code == 200, page.text
        text = html.unescape(page.text)
        assert "Deployment llm" in text
        assert 'data-status="unhealthy"' in text
        assert "10.1.2.3:40123" in text
        assert "7s ago" in text
        assert '<td class="failures">4' in text
        assert "GET /health answered 503" in text


async def test_a_plain_user_never_sees_another_users_deployment(world: ApiWorld) -> None:
    """Bob's list does not show Alice's deployment and its page by id or name is 'no such
    deployment'; the admin sees both users' deployments."""
    alices = await _deploy(world, world.alice, "alice-secret")
    bobs = await _deploy(world, world.bob, "bobs-own")
    bob = await sign_in(world, world.bob)
    listed = await world.http.get("/ui/deployments", headers=bob)
    assert "bobs-own" in listed.text
    assert "alice-secret" not in listed.text and alices["id"] not in listed.text
    for ref in (alices["id"], "alice-secret"):
        page = await world.http.get(f"/ui/deployments/{ref}", headers=bob)
        assert page.status_code == 404, ref
        assert "No such deployment" in page.text
        shown = html.unescape(page.text).replace(f"no deployment '{ref}'", "")
        assert "alice-secret" not in shown and ">alice<" not in shown
        assert "data-route" not in page.text
    admin = await sign_in(world, world.admin)
    everyone = await world.http.get("/ui/deployments", headers=admin)
    assert "alice-secret" in everyone.text and "bobs-own" in everyone.text
    assert (await world.http.get(f"/ui/deployments/{bobs['id']}", headers=admin)).status_code == 200
    assert (await world.http.get("/ui/deployments")).status_code == 303  # signed out
