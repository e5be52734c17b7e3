"""All-or-nothing admission over HTTP, on SQLite and PostgreSQL: a group's options (admins
change them through `/v1/resource-groups`, bad ones are refused naming the field, nothing
written), and the kernel restart policy's limit and restarts as the API shows them."""

from __future__ import annotations

import uuid
from typing import Any

from corral.coordination.hints import Hint
from corral.domain.admission import KERNELS_READY_TIMEOUT
from corral.domain.restarts import MAX_RESTART_LIMIT
from corral.domain.types import KernelId
from tests.integration.api.conftest import ApiWorld
from tests.integration.api.test_sessions_api import create, problem


async def _patch(world: ApiWorld, options: dict[str, Any]) -> Any:
    return await world.http.patch(
        "/v1/resource-groups/default", json={"options": options}, headers=world.admin.headers
    )


async def test_admins_turn_it_on_per_group_and_everyone_sees_the_defaults(
    world: ApiWorld,
) -> None:
    shown = await world.http.get("/v1/resource-groups/default", headers=world.alice.headers)
    assert shown.json()["options"]["wait_for_kernels_ready"] == {
        "enable": False,
        "timeout_s": 300,
        "block_admission": False,
        "recovery_timeout_s": None,
        "requeuing": {
            "timestamp": "eviction",
            "backoff_limit_count": None,
            "backoff_limit_timeout_s": None,
            "backoff_base_s": 60,
            "backoff_max_s": 3600,
        },
        "deactivated_retention_s": None,
    }
    changed = await _patch(
        world, {"wait_for_kernels_ready": {"enable": True, "requeuing": {"backoff_limit_count": 3}}}
    )
    assert changed.status_code == 200, changed.text
    # A later patch of one nested key keeps the others (a JSON merge patch).
    changed = await _patch(
        world, {"wait_for_kernels_ready": {"requeuing": {"timestamp": "creation"}}}
    )
    options = changed.json()["options"]["wait_for_kernels_ready"]
    assert options["enable"] is True
    assert options["requeuing"]["backoff_limit_count"] == 3
    assert options["requeuing"]["timestamp"] == "creation"
    refused = await world.http.patch(
        "/v1/resource-groups/default",
        json={"options": {"wait_for_kernels_ready": {"enable": False}}},
        headers=world.alice.headers,
    )
    assert refused.status_code == 403


async def test_a_change_of_options_wakes_the_eviction_task(world: ApiWorld) -> None:
    """EvictNotReady looks again only when a timeout it knows of comes due: turning admission
    on in a running cluster (or making a group with it on) must wake it, else the first
    timeouts are late by up to the long loop's minute."""
    hints = world.cluster.hints
    await hints.consume(Hint.ADMISSION.value)
    assert (await _patch(world, {"wait_for_kernels_ready": {"enable": True}})).status_code == 200
    assert await hints.consume(Hint.ADMISSION.value)
    made = await world.http.post(
        "/v1/resource-groups",
        json={"name": "gang", "options": {"wait_for_kernels_ready": {"enable": True}}},
        headers=world.admin.headers,
    )
    assert made.status_code == 201, made.text
    assert await hints.consume(Hint.ADMISSION.value)


async def test_bad_options_are_a_422_naming_the_field_and_nothing_changes(
    world: ApiWorld,
) -> None:
    refused = await _patch(world, {"wait_for_kernels_ready": {"enable": True, "timeout_s": 0}})
    body = problem(refused, 422, "validation-error")
    assert [e["field"] for e in body["errors"]] == ["options.wait_for_kernels_ready.timeout_s"]
    shown = await world.http.get("/v1/resource-groups/default", headers=world.admin.headers)
    assert shown.json()["options"]["wait_for_kernels_ready"]["enable"] is False


async def test_a_deactivated_session_is_shown_so_and_its_owner_activates_it(
    world: ApiWorld,
) -> None:
    """Its kernels never ready in time and no requeue allowed: the first timeout deactivates
    it; the API shows why, `activate` (the owner's or an admin's, nobody else's) queues it
    again with a fresh count, and the events say all of it."""
    c = world.cluster
    c.agent.unresponsive.update(c.agents)
    wait = {"enable": True, "timeout_s": 60, "requeuing": {"backoff_limit_count": 0}}
    assert (await _patch(world, {"wait_for_kernels_ready": wait})).status_code == 200
    created = await create(world, world.alice)
    sid = created.json()["id"]
    await c.settle()
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert (shown["kernels_ready"], shown["kernels_ready_reason"]) == (False, "WaitForStart")
    c.clock.advance(60)
    await c.settle()
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert shown["status"] == "PENDING" and shown["active"] is False
    assert shown["eviction_reason"] == KERNELS_READY_TIMEOUT
    assert shown["kernels_ready"] is None
    assert "deactivated" in shown["status_info"]
    listed = await world.http.get(
        "/v1/sessions", params={"reasons": "true"}, headers=world.alice.headers
    )
    assert [(s["id"], s["active"], s["reason"]) for s in listed.json()["items"]] == [
        (sid, False, "deactivated")
    ]
    refused = await world.http.post(f"/v1/sessions/{sid}/activate", headers=world.bob.headers)
    assert refused.status_code == 404
    done = await world.http.post(f"/v1/sessions/{sid}/activate", headers=world.alice.headers)
    assert done.status_code == 200, done.text
    assert done.json()["outcome"] == "activated"
    again = await world.http.post(f"/v1/sessions/{sid}/activate", headers=world.admin.headers)
    assert again.json()["outcome"] == "unchanged"
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert (shown["active"], shown["requeue_count"], shown["requeue_at"]) == (True, 0, None)
    c.agent.unresponsive.clear()
    await c.settle()
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert shown["status"] == "RUNNING" and shown["kernels_ready"] is True
    events = await world.http.get(
        "/v1/events",
        params={"entity_id": sid, "follow": "false"},
        headers=world.alice.headers,
    )
    kinds = [e["kind"] for e in events.json()["items"] if e["kind"] != "session.status_changed"]
    assert kinds == [
        "session.created",
        "session.evicted",
        "session.deactivated",
        "session.activated",
    ]


async def test_a_restart_limit_out_of_bounds_is_a_422_naming_the_field(world: ApiWorld) -> None:
    """restart_limit above the bound, or negative: refused naming the field, nothing created."""
    for bad in (MAX_RESTART_LIMIT + 1, -1, "many"):
        refused = await create(world, world.alice, restart_limit=bad)
        body = problem(refused, 422, "validation-error")
        assert [e["field"] for e in body["errors"]] == ["restart_limit"]
    listed = await world.http.get("/v1/sessions", headers=world.alice.headers)
    assert listed.json()["items"] == []


async def test_a_restarting_kernel_is_shown_with_its_session_waiting_for_recovery(
    world: ApiWorld,
) -> None:
    """Through the API: the limit, the kernel's restart count and its restarting flag, the
    session's KernelsReady WaitForRecovery then Recovered, and the events of both."""
    c = world.cluster
    created = await create(world, world.alice, restart_limit=3)
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    await c.settle()
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert (shown["restart_limit"], shown["restarts"], shown["kernels_ready"]) == (3, 0, True)
    kernel = KernelId(uuid.UUID(shown["kernels"][0]["id"]))
    await c.agent.restart([kernel], 1, restarting=True)
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert (shown["kernels_ready"], shown["kernels_ready_reason"]) == (False, "WaitForRecovery")
    assert (shown["kernels"][0]["restarts"], shown["kernels"][0]["restarting"]) == (1, True)
    assert shown["restarts"] == 1 and shown["status"] == "RUNNING"
    await c.agent.restart([kernel], 1, restarting=False)
    shown = (await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)).json()
    assert (shown["kernels_ready"], shown["kernels_ready_reason"]) == (True, "Recovered")
    assert shown["kernels"][0]["restarting"] is False
    events = await world.http.get(
        "/v1/events", params={"entity_id": sid, "follow": "false"}, headers=world.alice.headers
    )
    kinds = [e["kind"] for e in events.json()["items"] if e["kind"] != "session.status_changed"]
    assert kinds == ["session.created", "session.kernel_restarting", "session.recovered"]
    hidden = await world.http.get(
        "/v1/events", params={"entity_id": sid, "follow": "false"}, headers=world.bob.headers
    )
    assert hidden.json()["items"] == []
