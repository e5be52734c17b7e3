"""Session retry over HTTP: the chain's fields, the attempts, terminate, the kill switch."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.api.test_sessions_api import create, problem

POLICY = {"max_retries": 1, "retry_delay": 10, "jitter": "none"}


async def _get(world: ApiWorld, caller: Caller, path: str) -> dict[str, Any]:
    response = await world.http.get(path, headers=caller.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_failed_session_shows_its_retry_chain_and_attempts(world: ApiWorld) -> None:
    """GET shows the chain and "retry scheduled at T"; /attempts lists both; others see 404."""
    world.cluster.agent.exit_code = lambda kernel: 2
    world.cluster.agent.nonzero_exit_fails = True
    response = await create(world, world.alice, retry_policy=POLICY, creation_id="job-7")
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    assert response.json()["max_retries"] == 1
    await world.cluster.settle()
    parent = await _get(world, world.alice, f"/v1/sessions/{sid}")
    assert (parent["status"], parent["failure_cause"]) == ("ERROR", "kernel_nonzero_exit")
    assert parent["retry_decision"] == "scheduled"
    assert parent["retry_policy"]["retry_delay"] == 10
    assert parent["retry_chain"][0] == sid and len(parent["retry_chain"]) == 2
    child_id = parent["retry_chain"][1]
    child = await _get(world, world.alice, f"/v1/sessions/{child_id}")
    assert parent["retry_state"] == (
        f"retry scheduled at {child['starts_at'][:19]}Z (attempt 2 of 2: session {child['number']})"
    )
    assert (child["parent_session_id"], child["retry_count"], child["retry_cause"]) == (
        sid,
        1,
        "kernel_nonzero_exit",
    )
    assert child["creation_id"] == "job-7:retry:1"
    assert child["retry_state"].startswith("attempt 2 of 2, starts at ")
    attempts = await _get(world, world.alice, f"/v1/sessions/{child_id}/attempts")
    assert [(a["attempt"], a["status"], a["exit_code"]) for a in attempts["items"]] == [
        (1, "ERROR", 2),
        (2, "PENDING", None),
    ]
    response = await world.http.get(f"/v1/sessions/{sid}/attempts", headers=world.bob.headers)
    problem(response, 404, "session-not-found")
    # Terminating the failed attempt stops the chain and cancels the waiting retry.
    response = await world.http.post(f"/v1/sessions/{sid}/terminate", headers=world.alice.headers)
    ended = response.json()
    assert (ended["outcome"], ended["retry_chain_stopped"], ended["chain_ended"]) == (
        "unchanged",
        True,
        [child_id],
    )
    assert "retry chain was stopped" in ended["message"]
    child = await _get(world, world.alice, f"/v1/sessions/{child_id}")
    assert (child["status"], child["retry_decision"]) == ("CANCELLED", "stopped")


async def test_bad_retry_policies_are_refused_naming_the_field(world: ApiWorld) -> None:
    """422 naming retry_policy's field; nothing is written."""
    response = await create(world, world.alice, retry_policy={"max_retries": -1})
    body = problem(response, 422, "validation-error")
    assert [e["field"] for e in body["errors"]] == ["retry_policy.max_retries"]
    response = await create(
        world, world.alice, type="INTERACTIVE", command=[], retry_policy={"max_retries": 1}
    )
    body = problem(response, 422, "validation-error")
    assert [e["field"] for e in body["errors"]] == ["retry_policy"]
    listed = await _get(world, world.alice, "/v1/sessions")
    assert listed["items"] == []


async def test_only_admins_pause_retries_and_everyone_sees_it(world: ApiWorld) -> None:
    """PUT /v1/retries: 403 for a user; an admin pauses; a user's GET says paused, by whom."""
    response = await world.http.put(
        "/v1/retries", json={"paused": True}, headers=world.alice.headers
    )
    problem(response, 403, "forbidden")
    response = await world.http.put(
        "/v1/retries", json={"paused": True, "reason": "storm"}, headers=world.admin.headers
    )
    assert response.status_code == 200, response.text
    seen = await _get(world, world.alice, "/v1/retries")
    assert (seen["paused"], seen["reason"], seen["changed_by"]) == (True, "storm", "root")
    assert seen["cluster_default"]["max_retries"] == 0


async def test_a_field_a_session_sets_wins_over_its_group_also_when_it_is_the_default(
    world: ApiWorld,
) -> None:
    """The group's policy caps delays at 100 s; a session that sets the shipped default of
    3,600 s itself keeps it, one that sets nothing gets the group's; the same policy values
    with other fields set merge differently (and a shared merge per policy must tell them
    apart)."""
    response = await world.http.patch(
        "/v1/resource-groups/default",
        json={"options": {"retry_policy": {"max_retry_delay": 100}}},
        headers=world.admin.headers,
    )
    assert response.status_code == 200, response.text
    plain = {"max_retries": 1}
    explicit = {"max_retries": 1, "max_retry_delay": 3600}
    for asked, expected in ((plain, 100), (explicit, 3600), (plain, 100), (explicit, 3600)):
        response = await create(world, world.alice, retry_policy=asked)
        assert response.status_code == 201, response.text
        assert response.json()["retry_policy"]["max_retry_delay"] == expected, asked
