"""`/v1/deployments`: create, list, get, scale and destroy, validation and owner isolation."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from corral.coordination.serving import serving_coordinators
from corral.store.tables import deployments
from tests.integration.api.conftest import ApiWorld

SPEC: dict[str, Any] = {
    "name": "llm",
    "image": "python",
    "command": ["python", "server.py"],
    "replicas": 2,
}


async def test_create_list_get_scale_destroy(world: ApiWorld) -> None:
    """A deployment is created PENDING with its defaults, listed, read, scaled and destroyed."""
    http, alice = world.http, world.alice.headers
    created = await http.post("/v1/deployments", json=SPEC, headers=alice)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["lifecycle"] == "pending"
    assert body["replicas"] == 2
    assert body["owner"] == "alice"
    assert body["health_check"] == {
        "path": "/health",
        "interval_s": 10.0,
        "timeout_s": 1.0,
        "initial_delay_s": 0.0,
        "failure_threshold": 3,
        "success_threshold": 1,
        "expected_status": 200,
    }
    assert body["routes"] == []
    listed = (await http.get("/v1/deployments", headers=alice)).json()["items"]
    assert [d["name"] for d in listed] == ["llm"]
    by_name = await http.get("/v1/deployments/llm", headers=alice)
    by_id = await http.get(f"/v1/deployments/{body['id']}", headers=alice)
    assert by_name.json()["id"] == by_id.json()["id"] == body["id"]
    scaled = await http.post("/v1/deployments/llm/scale", json={"replicas": 3}, headers=alice)
    assert scaled.status_code == 200, scaled.text
    assert scaled.json()["replicas"] == 3
    destroyed = await http.delete("/v1/deployments/llm", headers=alice)
    assert destroyed.json()["lifecycle"] == "destroying"
    refused = await http.post("/v1/deployments/llm/scale", json={"replicas": 1}, headers=alice)
    assert refused.status_code == 409
    assert refused.json()["type"].endswith("/deployment-ended")


async def test_the_same_name_twice_is_a_conflict(world: ApiWorld) -> None:
    """A name is unique among one owner's deployments, not across owners."""
    http = world.http
    assert (
        await http.post("/v1/deployments", json=SPEC, headers=world.alice.headers)
    ).status_code == 201
    again = await http.post("/v1/deployments", json=SPEC, headers=world.alice.headers)
    assert again.status_code == 409
    assert again.json()["type"].endswith("/deployment-name-taken")
    assert (
        await http.post("/v1/deployments", json=SPEC, headers=world.bob.headers)
    ).status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "no spaces"}, "name"),
        ({"command": []}, "command"),
        ({"image": "has space"}, "image"),
        ({"env": {"CORRAL_PORT": "1"}}, "env"),
        ({"replicas": -1}, "replicas"),
        ({"health_check": {"path": "health"}}, "health_check.path"),
        ({"health_check": {"interval_s": 0}}, "health_check.interval_s"),
        ({"resource_group": "nowhere"}, "resource_group"),
    ],
)
async def test_bad_specs_are_refused_naming_the_field(
    world: ApiWorld, change: dict[str, Any], field: str
) -> None:
    """A bad spec is a 422 naming the field, and nothing is written."""
    http, alice = world.http, world.alice.headers
    answer = await http.post("/v1/deployments", json={**SPEC, **change}, headers=alice)
    assert answer.status_code == 422, answer.text
    assert field in [e["field"] for e in answer.json()["errors"]]
    assert (await http.get("/v1/deployments", headers=alice)).json()["items"] == []


async def test_owners_see_only_their_own(world: ApiWorld) -> None:
    """Bob cannot see, scale or destroy Alice's deployment (404); an admin sees it."""
    http = world.http
    created = (await http.post("/v1/deployments", json=SPEC, headers=world.alice.headers)).json()
    bob = world.bob.headers
    assert (await http.get("/v1/deployments", headers=bob)).json()["items"] == []
    for method, path, body in (
        ("GET", f"/v1/deployments/{created['id']}", None),
        ("POST", f"/v1/deployments/{created['id']}/scale", {"replicas": 0}),
        ("DELETE", f"/v1/deployments/{created['id']}", None),
        ("GET", "/v1/deployments/llm", None),
    ):
        answer = await http.request(method, path, json=body, headers=bob)
        assert answer.status_code == 404, (method, path)
    admin = world.admin.headers
    assert [
        d["id"] for d in (await http.get("/v1/deployments", headers=admin)).json()["items"]
    ] == [created["id"]]
    assert (await http.get(f"/v1/deployments/{created['id']}", headers=admin)).status_code == 200
    assert (await http.get("/v1/deployments")).status_code == 401


async def test_the_route_table_is_for_admins(world: ApiWorld) -> None:
    """GET /v1/serving/routes: admins (a proxy's token) read it; a plain user is refused."""
    http = world.http
    assert (await http.get("/v1/serving/routes", headers=world.alice.headers)).status_code == 403
    table = await http.get("/v1/serving/routes", headers=world.admin.headers)
    assert table.json() == {"revision": 0, "deployments": []}


async def test_update_starts_a_rolling_update_and_refuses_a_second(world: ApiWorld) -> None:
    """POST /update: DEPLOYING with the next revision; a bad field is a 422 naming it; while
    one runs, another is a 409."""
    http, alice = world.http, world.alice.headers
    await http.post("/v1/deployments", json=SPEC, headers=alice)
    bad = await http.post("/v1/deployments/llm/update", json={"command": []}, headers=alice)
    assert bad.status_code == 422
    assert [e["field"] for e in bad.json()["errors"]] == ["command"]
    # Still PENDING: not yet updatable (it has not scaled once).
    busy = await http.post("/v1/deployments/llm/update", json={"image": "shell"}, headers=alice)
    assert busy.status_code == 409
    assert busy.json()["type"].endswith("/deployment-busy")


async def test_metrics_count_routes_by_status(world: ApiWorld) -> None:
    """/metrics has the routes by status, every status listed."""
    text = (await world.http.get("/metrics")).text
    assert 'corral_routes{status="healthy"} 0.0' in text
    assert 'corral_routes{status="provisioning"} 0.0' in text


AUTOSCALED = {**SPEC, "autoscaling": {"min_replicas": 1, "max_replicas": 4}}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "autoscaling.max_replicas"),
        ({"autoscaling": {"min_replicas": 0, "max_replicas": 2}}, "autoscaling.min_replicas"),
        ({"autoscaling": {"max_replicas": 2, "target_inflight": 0}}, "autoscaling.target_inflight"),
        (
            {"autoscaling": {"max_replicas": 2, "upscale_delay_s": -1}},
            "autoscaling.upscale_delay_s",
        ),
        ({"autoscaling": {"min_replicas": 1}}, "autoscaling.max_replicas"),
        ({"autoscaling": {"max_replicas": 2, "speed": 1}}, "autoscaling.speed"),
        ({"replicas": 5, "autoscaling": {"max_replicas": 4}}, "replicas"),
        ({"drain_grace_s": -1}, "drain_grace_s"),
    ],
)
async def test_bad_autoscaling_and_drain_specs_are_refused_naming_the_field(
    world: ApiWorld, change: dict[str, Any], field: str
) -> None:
    """A bad autoscaling policy or drain grace is a 422 naming the field; nothing written."""
    http, alice = world.http, world.alice.headers
    answer = await http.post("/v1/deployments", json={**SPEC, **change}, headers=alice)
    assert answer.status_code == 422, answer.text
    assert [e["field"] for e in answer.json()["errors"]] == [field]
    assert (await http.get("/v1/deployments", headers=alice)).json()["items"] == []


async def test_autoscaling_is_shown_bounds_scale_and_changes_in_place(world: ApiWorld) -> None:
    """The policy is shown; a scale outside its bounds is a 422 naming replicas; an update of
    the policy alone changes it in place (no rolling update), the count kept in bounds."""
    http, alice = world.http, world.alice.headers
    created = await http.post("/v1/deployments", json=AUTOSCALED, headers=alice)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["autoscaling"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_inflight": 2.0,
        "upscale_delay_s": 30.0,
        "downscale_delay_s": 600.0,
    }
    assert body["drain_grace_s"] == 30.0
    assert body["autoscale_wanted"] is None
    refused = await http.post("/v1/deployments/llm/scale", json={"replicas": 5}, headers=alice)
    assert refused.status_code == 422
    assert [e["field"] for e in refused.json()["errors"]] == ["replicas"]
    assert (
        await http.post("/v1/deployments/llm/scale", json={"replicas": 4}, headers=alice)
    ).status_code == 200
    changed = await http.post(
        "/v1/deployments/llm/update",
        json={"autoscaling": {"min_replicas": 1, "max_replicas": 3}, "drain_grace_s": 5},
        headers=alice,
    )
    assert changed.status_code == 200, changed.text
    after = changed.json()
    assert (after["lifecycle"], after["revision"]) == ("pending", 0)  # no rolling update
    assert (after["replicas"], after["autoscaling"]["max_replicas"]) == (3, 3)
    assert after["drain_grace_s"] == 5.0
    off = await http.post("/v1/deployments/llm/update", json={"autoscaling": None}, headers=alice)
    assert off.status_code == 200, off.text
    assert (off.json()["autoscaling"], off.json()["replicas"]) == (None, 3)
    assert (
        await http.post("/v1/deployments/llm/scale", json={"replicas": 9}, headers=alice)
    ).status_code == 200  # no bounds any more


async def test_proxies_report_their_load_as_admins(world: ApiWorld) -> None:
    """POST /v1/serving/load: a proxy (an admin's token) reports its requests in flight; the
    answer sums the live proxies'; a plain user is refused; a bad report is a 422."""
    http = world.http
    deployment = str(uuid.uuid4())
    report = {"proxy_id": "p-1", "table_revision": 0, "inflight": {deployment: {"h:1": 2}}}
    assert (
        await http.post("/v1/serving/load", json=report, headers=world.alice.headers)
    ).status_code == 403
    first = await http.post("/v1/serving/load", json=report, headers=world.admin.headers)
    assert first.status_code == 200, first.text
    second = await http.post(
        "/v1/serving/load",
        json={**report, "proxy_id": "p-2", "inflight": {deployment: {"h:1": 1, "h:2": 4}}},
        headers=world.admin.headers,
    )
    assert second.json() == {"proxies": 2, "inflight": {deployment: 7}}
    again = await http.post(
        "/v1/serving/load", json={**report, "inflight": {}}, headers=world.admin.headers
    )
    assert again.json() == {"proxies": 2, "inflight": {deployment: 5}}  # p-1's replaced
    bad = await http.post(
        "/v1/serving/load",
        json={**report, "inflight": {deployment: {"h:1": -1}}},
        headers=world.admin.headers,
    )
    assert bad.status_code == 422


async def test_history_shows_what_the_handlers_did(world: ApiWorld) -> None:
    """GET /history: the deployment's handler outcomes and its routes', owner-only."""
    http, alice = world.http, world.alice.headers
    created = (await http.post("/v1/deployments", json=SPEC, headers=alice)).json()
    deployments, routes = serving_coordinators(
        world.cluster.db,
        world.cluster.hints,
        world.cluster.events,
        world.cluster.controller,
        clock=world.cluster.clock,
    )
    for task in [*deployments.tasks(), *routes.tasks()]:
        await task.run()
    history = await http.get("/v1/deployments/llm/history", headers=alice)
    assert history.status_code == 200, history.text
    own = history.json()["deployment"]
    assert (own[0]["phase"], own[0]["from_status"], own[0]["to_status"], own[0]["result"]) == (
        "CheckPendingDeployment",
        "pending",
        "scaling",
        "SUCCESS",
    )
    assert (
        await http.get(f"/v1/deployments/{created['id']}/history", headers=world.bob.headers)
    ).status_code == 404


async def test_access_by_token_shows_the_token_once_and_rotates_it(world: ApiWorld) -> None:
    """By token (the default): the create answer alone shows the token, whose SHA-256 is what
    is kept; the owner rotates it (a new one each time), another user cannot (404), an open
    deployment has none (409); a bad access is a 422 naming the field."""
    http, alice = world.http, world.alice.headers
    created = (await http.post("/v1/deployments", json=SPEC, headers=alice)).json()
    assert created["access"] == "token" and created["token"].startswith("crld_")
    shown = (await http.get("/v1/deployments/llm", headers=alice)).json()
    assert shown["access"] == "token" and "token" not in shown
    async with world.cluster.db.read() as conn:
        kept = await conn.scalar(sa.select(deployments.c.token_hash))
    assert kept == hashlib.sha256(created["token"].encode()).hexdigest()

    rotated = await http.post("/v1/deployments/llm/token", headers=alice)
    assert rotated.status_code == 200, rotated.text
    fresh = rotated.json()["token"]
    assert fresh.startswith("crld_") and fresh != created["token"]
    async with world.cluster.db.read() as conn:
        kept = await conn.scalar(sa.select(deployments.c.token_hash))
    assert kept == hashlib.sha256(fresh.encode()).hexdigest()
    other = await http.post(f"/v1/deployments/{created['id']}/token", headers=world.bob.headers)
    assert other.status_code == 404

    opened = await http.post(
        "/v1/deployments", json={**SPEC, "name": "open", "access": "open"}, headers=alice
    )
    assert opened.json()["access"] == "open" and opened.json()["token"] is None
    refused = await http.post("/v1/deployments/open/token", headers=alice)
    assert refused.status_code == 409
    assert refused.json()["type"].endswith("/deployment-not-by-token")

    bad = await http.post(
        "/v1/deployments", json={**SPEC, "name": "bad", "access": "public"}, headers=alice
    )
    assert bad.status_code == 422
    assert "access" in [e["field"] for e in bad.json()["errors"]]
