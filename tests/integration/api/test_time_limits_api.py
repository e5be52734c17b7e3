"""Wall-time limits through the real app, with the cluster's injected clock (both backends)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from corral.domain.outcome import TIME_LIMIT, SessionResult
from corral.store.tables import agent_slots, session_history
from tests.integration.api.conftest import ApiWorld
from tests.integration.api.test_sessions_api import create


async def _get(world: ApiWorld, sid: str) -> dict[str, Any]:
    response = await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _submit(world: ApiWorld, **fields: Any) -> dict[str, Any]:
    response = await create(world, world.alice, **fields)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def _set_options(world: ApiWorld, **options: Any) -> Any:
    return await world.http.patch(
        "/v1/resource-groups/default", json={"options": options}, headers=world.admin.headers
    )


async def _occupied(world: ApiWorld) -> int:
    async with world.cluster.db.read() as conn:
        total = await conn.scalar(sa.select(sa.func.sum(agent_slots.c.occupied)))
    return int(total or 0)


async def test_a_session_past_its_limit_is_stopped_with_result_timeout(world: ApiWorld) -> None:
    """Running at its deadline: stopped, TERMINATED with result timeout and cause time_limit."""
    sid = (await _submit(world, time_limit_s=60))["id"]
    await world.cluster.settle()
    running = await _get(world, sid)
    assert (running["status"], running["time_limit_s"]) == ("RUNNING", 60)
    started = datetime.fromisoformat(running["started_at"])
    deadline = datetime.fromisoformat(running["deadline_at"])
    assert abs((deadline - started).total_seconds() - 60) < 0.01
    assert (await world.cluster.coordinator.run_time_limits()).due_in_s == 60

    world.cluster.clock.advance(59)
    await world.cluster.settle()
    assert (await _get(world, sid))["status"] == "RUNNING"

    world.cluster.clock.advance(2)
    await world.cluster.settle()
    ended = await _get(world, sid)
    assert (ended["status"], ended["result"], ended["failure_cause"]) == (
        "TERMINATED",
        SessionResult.TIMEOUT,
        TIME_LIMIT,
    )
    assert "time limit of 1m" in ended["status_info"]
    assert ended["deadline_at"] is None
    assert [k["status"] for k in ended["kernels"]] == ["TERMINATED"]
    assert await _occupied(world) == 0
    async with world.cluster.db.read() as conn:
        phases = (
            await conn.scalars(
                sa.select(session_history.c.phase).where(
                    session_history.c.session_id == uuid.UUID(sid)
                )
            )
        ).all()
    assert "EnforceTimeLimits" in phases
    events = await world.http.get(
        "/v1/events", params={"follow": "false"}, headers=world.alice.headers
    )
    reasons = [
        e["payload"].get("reason")
        for e in events.json()["items"]
        if e["entity_id"] == sid and e["kind"] == "session.status_changed"
    ]
    assert any("time limit" in (r or "") for r in reasons), reasons


async def test_without_a_limit_nothing_is_due(world: ApiWorld) -> None:
    """A session without a limit runs on; the task has no deadline to wake for."""
    sid = (await _submit(world))["id"]
    await world.cluster.settle()
    world.cluster.clock.advance(10**6)
    await world.cluster.settle()
    assert (await _get(world, sid))["status"] == "RUNNING"
    assert (await world.cluster.coordinator.run_time_limits()).due_in_s is None


async def test_the_groups_default_and_maximum_apply(world: ApiWorld) -> None:
    """No limit given: the group's default; over its maximum: a 422 naming time_limit_s."""
    response = await _set_options(world, default_time_limit_s=600, max_time_limit_s=3600)
    assert response.status_code == 200, response.text
    assert (await _submit(world))["time_limit_s"] == 600
    assert (await _submit(world, time_limit_s=3600))["time_limit_s"] == 3600
    over = await create(world, world.alice, time_limit_s=3601)
    assert over.status_code == 422, over.text
    assert [e["field"] for e in over.json()["errors"]] == ["time_limit_s"]
    assert "over the maximum of 1h" in over.json()["errors"][0]["message"]


async def test_group_limits_are_validated(world: ApiWorld) -> None:
    """A default over the maximum, or a limit that is not a positive number, is refused."""
    bad = await _set_options(world, default_time_limit_s=7200, max_time_limit_s=3600)
    assert bad.status_code == 422, bad.text
    assert "must not exceed max_time_limit_s" in bad.text
    assert (await _set_options(world, max_time_limit_s=0)).status_code == 422
    spec = await create(world, world.alice, time_limit_s=0)
    assert spec.status_code == 422
    assert [e["field"] for e in spec.json()["errors"]] == ["time_limit_s"]
