"""How sessions end and what it means for their dependants, through the real app."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from corral.domain.outcome import USER_CANCELLED, SessionResult
from corral.domain.types import KernelId
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.api.test_sessions_api import create


async def _get(world: ApiWorld, caller: Caller, sid: str) -> dict[str, Any]:
    response = await world.http.get(f"/v1/sessions/{sid}", headers=caller.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _submit(world: ApiWorld, **fields: Any) -> str:
    response = await create(world, world.alice, **fields)
    assert response.status_code == 201, response.text
    sid: str = response.json()["id"]
    return sid


async def _run_and_exit(world: ApiWorld, sid: str, code: int) -> dict[str, Any]:
    """Let the cluster start the session, its kernel exit with `code`, and the session end."""
    await world.cluster.settle()
    running = await _get(world, world.alice, sid)
    assert running["status"] == "RUNNING"
    await world.cluster.agent.exit([KernelId(uuid.UUID(k["id"])) for k in running["kernels"]], code)
    await world.cluster.settle()
    return await _get(world, world.alice, sid)


async def test_a_running_session_its_user_terminates_ends_cancelled(world: ApiWorld) -> None:
    """Terminated while RUNNING: TERMINATED with result cancelled and cause user_cancelled."""
    sid = await _submit(world)
    await world.cluster.settle()
    assert (await _get(world, world.alice, sid))["status"] == "RUNNING"
    response = await world.http.post(f"/v1/sessions/{sid}/terminate", headers=world.alice.headers)
    assert response.json()["outcome"] == "terminating"
    await world.cluster.settle()
    ended = await _get(world, world.alice, sid)
    assert (ended["status"], ended["result"], ended["failure_cause"]) == (
        "TERMINATED",
        SessionResult.CANCELLED,
        USER_CANCELLED,
    )


async def test_a_pending_session_its_user_terminates_ends_cancelled(world: ApiWorld) -> None:
    """Terminated before it was placed: CANCELLED with result cancelled."""
    sid = await _submit(world)
    await world.http.post(f"/v1/sessions/{sid}/terminate", headers=world.alice.headers)
    ended = await _get(world, world.alice, sid)
    assert (ended["status"], ended["result"]) == ("CANCELLED", SessionResult.CANCELLED)


async def test_a_dependant_runs_once_its_dependency_succeeded(world: ApiWorld) -> None:
    """A succeeds → B (listed by id, afterok) is placed and runs."""
    a = await _submit(world)
    b = await _submit(world, dependencies=[a])
    ended = await _run_and_exit(world, a, 0)
    assert (ended["status"], ended["result"]) == ("TERMINATED", SessionResult.SUCCESS)
    assert (await _get(world, world.alice, b))["status"] == "RUNNING"


async def test_a_dependant_is_cancelled_when_its_dependency_failed(world: ApiWorld) -> None:
    """A fails → B is cancelled, its reason naming A."""
    a = await _submit(world)
    b = await _submit(world, dependencies=[a])
    ended = await _run_and_exit(world, a, 3)
    assert ended["result"] == SessionResult.FAILURE
    dependant = await _get(world, world.alice, b)
    assert dependant["status"] == "CANCELLED"
    assert f"session {(await _get(world, world.alice, a))['number']} " in dependant["status_info"]


async def test_a_dependant_waits_with_a_reason_naming_the_dependency_and_kind(
    world: ApiWorld,
) -> None:
    """While A runs, B (afterany) stays PENDING and explain says whom it waits for."""
    a = await _submit(world)
    b = await _submit(world, dependencies=[{"session": a, "kind": "afterany"}])
    await world.cluster.settle()
    assert (await _get(world, world.alice, b))["status"] == "PENDING"
    why = await world.http.get(f"/v1/sessions/{b}/explain", headers=world.alice.headers)
    number = (await _get(world, world.alice, a))["number"]
    assert f"waiting for session {number} (afterany)" in why.json()["message"]


@pytest.mark.parametrize(
    ("kind", "code", "runs"),
    [
        ("afterany", 3, True),
        ("afterany", 0, True),
        ("afternotok", 3, True),
        ("afternotok", 0, False),
        ("afterok", 3, False),
    ],
)
async def test_each_kind_after_a_success_or_a_failure(
    world: ApiWorld, kind: str, code: int, runs: bool
) -> None:
    """afterany runs after any end; afternotok after a failure only; afterok after success."""
    a = await _submit(world)
    b = await _submit(world, dependencies=[{"session": a, "kind": kind}])
    await _run_and_exit(world, a, code)
    dependant = await _get(world, world.alice, b)
    if runs:
        assert dependant["status"] == "RUNNING"
    else:
        assert dependant["status"] == "CANCELLED"
        number = (await _get(world, world.alice, a))["number"]
        assert f"session {number} ({kind})" in dependant["status_info"]


async def test_an_unknown_dependency_kind_is_a_422_naming_the_field(world: ApiWorld) -> None:
    """{"kind": "after"} is refused with an error located at the dependency's kind."""
    a = await _submit(world)
    response = await create(world, world.alice, dependencies=[{"session": a, "kind": "after"}])
    assert response.status_code == 422
    fields = [e["field"] for e in response.json()["errors"]]
    assert fields == ["dependencies.0.kind"], fields
