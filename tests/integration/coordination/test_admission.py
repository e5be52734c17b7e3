"""All-or-nothing admission (spec document 2) through the real coordinator, instant test
agents and an injected clock, on SQLite and PostgreSQL: the KernelsReady condition, eviction on
the start timeout, requeue backoff, deactivation and retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from corral.domain.admission import KERNELS_READY_TIMEOUT, KernelsReadyReason
from corral.domain.failure_causes import FailureCause
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.scheduler.explain import explain
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.resource_group_store import update_group
from corral.store.session_views import get_session
from tests.integration._statements import recorded_statements
from tests.integration.coordination._harness import Cluster, make_cluster
from tests.integration.store._factories import assert_slots_consistent

S, K = SessionStatus, KernelStatus
CPU4 = {"cpu": 4000}
TIMEOUT_S = 300


async def _enable(c: Cluster, **options: Any) -> None:
    wait = {"enable": True, "timeout_s": TIMEOUT_S, **options}
    await update_group(c.db, "default", c.clock(), options_patch={"wait_for_kernels_ready": wait})


async def _row(c: Cluster, sid: SessionId) -> dict[str, Any]:
    found = await get_session(c.db, sid)
    assert found is not None
    return found


async def _kinds(c: Cluster, sid: SessionId) -> list[str]:
    events = await read_events(c.db, entity_id=str(sid))
    return [e.kind for e in events if not e.kind.startswith("session.status")]


async def _stuck(c: Cluster) -> SessionId:
    """A 2-kernel multi-node session whose second agent never acts: admitted, never ready."""
    hung = sorted(c.agents)[1]
    c.agent.unresponsive.add(hung)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    await c.settle()
    return sid


async def test_a_session_has_its_kernels_ready_condition_once_admitted_and_started(
    db: Database,
) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    assert (await _row(c, sid))["kernels_ready"] is None  # not admitted
    await c.run("ScheduleNewSessions")
    row = await _row(c, sid)
    assert (row["kernels_ready"], row["kernels_ready_reason"]) == (
        False,
        KernelsReadyReason.WAIT_FOR_START.value,
    )
    assert row["kernels_ready_at"] == c.clock()
    c.clock.advance(5)
    await c.settle()
    row = await _row(c, sid)
    assert row["status"] == S.RUNNING.value
    assert (row["kernels_ready"], row["kernels_ready_reason"]) == (
        True,
        KernelsReadyReason.READY.value,
    )
    assert row["kernels_ready_at"] == c.clock()


async def test_disabled_by_default_a_stuck_session_is_never_evicted(db: Database) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    sid = await _stuck(c)
    c.clock.advance(TIMEOUT_S * 2)
    await c.settle()
    assert await c.status(sid) is S.PREPARING
    assert (await _row(c, sid))["requeue_count"] == 0


async def test_with_no_group_enabling_it_the_task_reads_no_session(db: Database) -> None:
    """Off (the default), an admission run reads nothing but the group options (which are kept
    for a while, `store.group_options`): no session is read."""
    c = await make_cluster(db, [CPU4] * 2)
    await _stuck(c)
    with recorded_statements(db) as statements:
        assert await c.run("EvictNotReady") == 0
    assert all("resource_groups" in statement for statement in statements), statements


async def test_past_the_start_timeout_a_session_is_evicted_requeued_and_runs_on_the_retry(
    db: Database,
) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, requeuing={"backoff_base_s": 60, "backoff_max_s": 200})
    sid = await _stuck(c)
    assert await c.run("EvictNotReady") == 0  # not yet
    c.clock.advance(TIMEOUT_S)
    assert await c.run("EvictNotReady") == 1
    evicted_at = c.clock()
    row = await _row(c, sid)
    assert row["status"] == S.PENDING.value
    assert (row["requeue_count"], row["evicted_at"], row["eviction_reason"]) == (
        1,
        evicted_at,
        KERNELS_READY_TIMEOUT,
    )
    assert row["requeue_at"] == evicted_at + timedelta(seconds=60)
    assert row["kernels_ready"] is None and row["active"] is True
    assert "WaitForStart" in row["status_info"]
    assert all(k["status"] == K.PENDING.value for k in row["kernels"])
    await assert_slots_consistent(db, c.agents, [sid])
    assert ("EvictNotReady", "EXPIRED", "PENDING", 1) in await c.moves_of(sid)
    assert await _kinds(c, sid) == ["session.created", "session.evicted", "session.requeued"]
    # Not placed before its requeue time.
    await c.settle()
    assert await c.status(sid) is S.PENDING
    # The second eviction waits twice as long, the third is capped at max.
    for n, wait in ((2, 120), (3, 200)):
        c.clock.now = (await _row(c, sid))["requeue_at"]
        await c.settle()
        assert await c.status(sid) is S.PREPARING
        c.clock.advance(TIMEOUT_S)
        assert await c.run("EvictNotReady") == 1
        row = await _row(c, sid)
        assert row["requeue_count"] == n
        assert row["requeue_at"] == c.clock() + timedelta(seconds=wait)
    # The agent recovers: the session runs when its backoff ends.
    c.agent.unresponsive.clear()
    c.clock.now = (await _row(c, sid))["requeue_at"]
    await c.settle()
    assert await c.status(sid) is S.RUNNING
    assert (await _row(c, sid))["kernels_ready"] is True


async def test_past_the_requeue_limit_the_next_timeout_deactivates_and_activation_resets(
    db: Database,
) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, requeuing={"backoff_limit_count": 1, "backoff_base_s": 10})
    sid = await _stuck(c)
    c.clock.advance(TIMEOUT_S)
    await c.run("EvictNotReady")  # requeue 1 of 1
    c.clock.advance(10)
    await c.settle()
    c.clock.advance(TIMEOUT_S)
    assert await c.run("EvictNotReady") == 1  # the second timeout deactivates at once
    row = await _row(c, sid)
    assert row["status"] == S.PENDING.value
    assert row["active"] is False
    assert (row["requeue_count"], row["requeue_at"]) == (0, None)  # reset (Kueue #2174)
    assert row["deactivated_at"] == c.clock()
    assert (await _kinds(c, sid))[-2:] == ["session.evicted", "session.deactivated"]
    c.clock.advance(3600)
    await c.settle()
    assert await c.status(sid) is S.PENDING  # out of the queue


async def test_a_deactivated_session_past_its_retention_is_cancelled(db: Database) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, requeuing={"backoff_limit_count": 0}, deactivated_retention_s=600)
    sid = await _stuck(c)
    c.clock.advance(TIMEOUT_S)
    assert await c.run("EvictNotReady") == 1  # deactivated at the first timeout
    assert (await _row(c, sid))["active"] is False
    c.clock.advance(599)
    assert await c.run("EvictNotReady") == 0
    c.clock.advance(1)
    assert await c.run("EvictNotReady") == 1
    row = await _row(c, sid)
    assert row["status"] == S.CANCELLED.value
    assert row["failure_cause"] == FailureCause.DEACTIVATED_RETENTION.value


async def test_the_backoff_time_limit_deactivates_whichever_limit_comes_first(
    db: Database,
) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, requeuing={"backoff_limit_timeout_s": 400, "backoff_base_s": 10})
    sid = await _stuck(c)
    c.clock.advance(TIMEOUT_S)
    await c.run("EvictNotReady")  # first eviction of the cycle, requeued
    assert (await _row(c, sid))["active"] is True
    c.clock.advance(10)
    await c.settle()
    c.clock.advance(TIMEOUT_S)  # 310 s since the first eviction: under the limit
    await c.run("EvictNotReady")
    assert (await _row(c, sid))["requeue_count"] == 2
    c.clock.advance(20)
    await c.settle()
    c.clock.advance(TIMEOUT_S)  # 630 s since the first eviction: past it
    await c.run("EvictNotReady")
    assert (await _row(c, sid))["active"] is False


async def test_blocking_admission_places_nothing_while_an_admitted_session_is_not_ready(
    db: Database,
) -> None:
    """With block_admission: of two sessions that both fit, only the first is admitted; the
    second is SKIPPED (never an attempt), and explain names the session it waits for; once
    the first is ready the second is admitted; a blocking session that ends unblocks."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, block_admission=True)
    first = await c.submit()
    second = await c.submit()
    assert await c.run("ScheduleNewSessions") == 1
    assert await c.status(first) is S.PREPARING  # placed, and asked to prepare in that commit
    assert await c.status(second) is S.PENDING
    await c.run("ScheduleNewSessions")
    assert await c.status(second) is S.PENDING
    assert [result for _, result, _, _ in await c.moves_of(second)] == ["SKIPPED"]
    number = (await _row(c, first))["number"]
    said = (await explain(db, second, c.clock())).message
    assert f"blocked by admission of session {number}" in said
    # The first becomes ready: the second goes.
    await c.settle()
    assert await c.status(first) is S.RUNNING
    assert await c.status(second) is S.RUNNING
    # A stuck one blocks a third until it is terminated.
    c.agent.unresponsive.update(c.agents)
    stuck = await c.submit()
    third = await c.submit()
    await c.settle()
    assert await c.status(stuck) is S.PREPARING and await c.status(third) is S.PENDING
    c.agent.unresponsive.clear()
    await c.controller.mark_terminate([stuck], "test")
    await c.settle()
    assert await c.status(third) is S.RUNNING


async def test_without_blocking_two_sessions_that_fit_are_both_admitted(db: Database) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c)
    first, second = await c.submit(), await c.submit()
    assert await c.run("ScheduleNewSessions") == 2
    assert {await c.status(first), await c.status(second)} == {S.PREPARING}


async def test_explain_says_how_long_a_session_backs_off_and_which_requeue(db: Database) -> None:
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, requeuing={"backoff_limit_count": 5})
    sid = await _stuck(c)
    c.clock.advance(TIMEOUT_S)
    await c.run("EvictNotReady")
    said = (await explain(db, sid, c.clock())).message
    until = (await _row(c, sid))["requeue_at"].isoformat()
    assert said.startswith(f"backing off until {until} (requeue 1 of 5)")


@pytest.mark.parametrize(("timestamp", "placed_next"), [("eviction", 1), ("creation", 0)])
async def test_the_requeuing_timestamp_decides_which_session_goes_first(
    db: Database, timestamp: str, placed_next: int
) -> None:
    """Two sessions that each fill the only agent: the first is admitted and evicted. By
    eviction time, the second (queued before that eviction) goes next; by creation time, the
    first keeps its place and goes again."""
    c = await make_cluster(db, [CPU4])
    c.agent.unresponsive.update(c.agents)
    await _enable(c, requeuing={"timestamp": timestamp, "backoff_base_s": 0})
    first = await c.submit(resources={"cpu": "4"})
    c.clock.advance(1)
    second = await c.submit(resources={"cpu": "4"})
    await c.settle()
    assert (await c.status(first), await c.status(second)) == (S.PREPARING, S.PENDING)
    c.clock.advance(TIMEOUT_S)
    assert await c.run("EvictNotReady") == 1
    await c.run("ScheduleNewSessions")
    placed = [sid for sid in (first, second) if await c.status(sid) is S.PREPARING]
    assert placed == [(first, second)[placed_next]]


async def test_a_session_whose_kernel_already_ended_ends_instead_of_waiting_forever(
    db: Database,
) -> None:
    """Rank 1 of a 2-kernel session started and finished at once, rank 0's agent went silent
    before starting it: evicted, the session cannot be placed again whole (an ended kernel
    never goes back to PENDING), so it ends with the eviction's cause and says why, instead of
    waiting in the queue for ever (before: PENDING, never placeable)."""
    c = await make_cluster(
        db, [CPU4] * 2, exit_code=lambda kernel: 0 if kernel.cluster_index == 1 else None
    )
    await _enable(c)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    for _ in range(20):
        await c.coordinator.run_all()
        if await c.status(sid) is S.CREATING:
            break
        await c.agent.step()
    assert await c.status(sid) is S.CREATING
    found = await c.session(sid)
    (rank0,) = [k for k in found.kernels if k.cluster_index == 0]
    assert rank0.agent_id is not None
    c.agent.unresponsive.add(rank0.agent_id)
    await c.settle()
    kernels = {k.cluster_index: k.status for k in (await c.session(sid)).kernels}
    assert kernels == {0: K.CREATING, 1: K.TERMINATED}, kernels
    c.clock.advance(TIMEOUT_S)
    assert await c.run("EvictNotReady") == 1
    c.agent.unresponsive.clear()
    await c.settle()
    row = await _row(c, sid)
    assert row["status"] in (S.TERMINATED.value, S.ERROR.value), row["status"]
    assert row["failure_cause"] == FailureCause.KERNELS_READY_TIMEOUT.value
    assert "not requeued: its kernel 1 already ended (TERMINATED)" in row["status_info"]
    await assert_slots_consistent(db, c.agents, [sid])
