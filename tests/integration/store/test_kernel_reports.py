"""Agents' kernel reports and assignments in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus
from corral.domain.types import AgentId, SessionId
from corral.store.agents import read_ledger
from corral.store.assignments import read_assignment, request_kernels
from corral.store.database import Database
from corral.store.kernel_reports import (
    KernelReport,
    KernelReportConflictError,
    apply_kernel_reports,
)
from corral.store.sessions import SessionRepository
from tests.integration.store._factories import NOW, add_agents, add_session_ids, add_user, place_all

K = KernelStatus


async def placed_session(db: Database) -> tuple[AgentId, SessionId]:
    """One single-kernel session placed (SCHEDULED) on a fresh agent."""
    (agent,) = await add_agents(db, [{"cpu": 4000}])
    (sid,) = await add_session_ids(db, await add_user(db), 1)
    await place_all(db, [sid], agent)
    return agent, sid


async def ask(db: Database, sid: SessionId, intent: KernelIntent, statuses: set[K]) -> set[AgentId]:
    async with db.transaction() as conn:
        return await request_kernels(conn, db.dialect, [sid], intent, statuses)


async def test_a_request_bumps_the_revision_once_and_shows_in_the_assignment(db: Database) -> None:
    """Asking twice for the same intent writes once; the agent sees it at a new revision."""
    agent, sid = await placed_session(db)
    before = await read_assignment(db, agent)
    assert before is not None and [k.desired_state for k in before.kernels] == [None]
    assert await ask(db, sid, KernelIntent.PREPARE, {K.SCHEDULED}) == {agent}
    assert await ask(db, sid, KernelIntent.PREPARE, {K.SCHEDULED}) == set()
    after = await read_assignment(db, agent)
    assert after is not None
    assert after.revision == before.revision + 1
    (kernel,) = after.kernels
    assert (kernel.desired_state, kernel.desired_generation) == (KernelIntent.PREPARE, 1)
    assert kernel.spec["image"] == "python"
    assert await read_assignment(db, AgentId("no-such-agent")) is None


async def test_reports_move_kernels_in_order_and_release_slots_at_the_end(db: Database) -> None:
    """One batch may walk a kernel through several statuses; ending it gives its slots back."""
    agent, sid = await placed_session(db)
    (session,) = await SessionRepository(db).get([sid])
    kid = session.kernels[0].id
    assert (await read_ledger(db))[agent]["cpu"] == [4000, 1000]
    outcome = await apply_kernel_reports(
        db,
        agent,
        [
            KernelReport(kid, K.PREPARING),
            KernelReport(kid, K.PREPARED),
            KernelReport(kid, K.CREATING),
            KernelReport(kid, K.RUNNING),
            KernelReport(kid, K.TERMINATED, exit_code=0),
        ],
        NOW,
    )
    assert outcome.moved[kid] == (K.SCHEDULED, K.TERMINATED)
    (session,) = await SessionRepository(db).get([sid])
    assert (session.kernels[0].status, session.kernels[0].exit_code) == (K.TERMINATED, 0)
    assert session.kernels[0].occupied_slots is None
    assert (await read_ledger(db))[agent]["cpu"] == [4000, 0]
    # The same final report again is harmless.
    again = await apply_kernel_reports(db, agent, [KernelReport(kid, K.TERMINATED)], NOW)
    assert again.moved == {}


async def test_an_impossible_report_rejects_the_batch_and_changes_nothing(db: Database) -> None:
    """A move the kernel table forbids, or another agent's kernel, refuses the whole batch."""
    agent, sid = await placed_session(db)
    (session,) = await SessionRepository(db).get([sid])
    kid = session.kernels[0].id
    with pytest.raises(KernelReportConflictError, match="cannot move from PREPARING to RUNNING"):
        await apply_kernel_reports(
            db, agent, [KernelReport(kid, K.PREPARING), KernelReport(kid, K.RUNNING)], NOW
        )
    with pytest.raises(KernelReportConflictError, match="not placed on agent"):
        await apply_kernel_reports(db, AgentId("stranger"), [KernelReport(kid, K.PREPARING)], NOW)
    (unchanged,) = await SessionRepository(db).get([sid])
    assert unchanged.kernels[0].status is K.SCHEDULED


async def test_a_failed_stage_is_recorded_and_cleared_by_asking_again(db: Database) -> None:
    """A stage failure keeps the status and marks the kernel; a new request clears the mark."""
    agent, sid = await placed_session(db)
    (session,) = await SessionRepository(db).get([sid])
    kid = session.kernels[0].id
    await apply_kernel_reports(db, agent, [KernelReport(kid, K.PREPARING)], NOW)
    failed = KernelReport(kid, K.PREPARING, failure_cause="image_pull_failure", stage_failed=True)
    outcome = await apply_kernel_reports(db, agent, [failed], NOW)
    assert outcome.stage_failures == {kid: K.PREPARING}
    (session,) = await SessionRepository(db).get([sid])
    assert (session.kernels[0].status, session.kernels[0].stage_failure) == (
        K.PREPARING,
        "image_pull_failure",
    )
    async with db.transaction() as conn:
        await request_kernels(
            conn, db.dialect, [sid], KernelIntent.PREPARE, {K.PREPARING}, again=True
        )
    (session,) = await SessionRepository(db).get([sid])
    assert session.kernels[0].stage_failure is None
    assert session.kernels[0].desired_generation == 1
    with pytest.raises(KernelReportConflictError, match="failed stage"):
        await apply_kernel_reports(
            db, agent, [KernelReport(kid, K.RUNNING, stage_failed=True)], NOW
        )


async def test_several_reports_of_several_kernels_land_in_order(db: Database) -> None:
    """Interleaved reports of two kernels leave each at its last status; hints see every step."""
    (agent,) = await add_agents(db, [{"cpu": 4000}])
    (sid,) = await add_session_ids(db, await add_user(db), 1, cluster_size=2)
    await place_all(db, [sid], agent)
    (session,) = await SessionRepository(db).get([sid])
    x, y = (k.id for k in session.kernels)
    walk = [K.PREPARING, K.PREPARED, K.CREATING]
    await apply_kernel_reports(
        db,
        agent,
        [KernelReport(k, s) for s in walk for k in (x, y)] + [KernelReport(y, K.RUNNING)],
        NOW,
    )
    outcome = await apply_kernel_reports(
        db,
        agent,
        [
            KernelReport(y, K.TERMINATED, exit_code=-15),
            KernelReport(x, K.RUNNING),
            KernelReport(x, K.TERMINATED, exit_code=0),
        ],
        NOW,
    )
    assert outcome.moved[x] == (K.CREATING, K.TERMINATED)
    assert outcome.moved_to() == {K.RUNNING, K.TERMINATED}
    (session,) = await SessionRepository(db).get([sid])
    assert [(k.status, k.exit_code, k.occupied_slots) for k in session.kernels] == [
        (K.TERMINATED, 0, None),
        (K.TERMINATED, -15, None),
    ]
    assert (await read_ledger(db))[agent]["cpu"] == [4000, 0]
