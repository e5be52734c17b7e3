"""Agents' kernel reports and assignments in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus
from corral.domain.types import AgentId, SessionId
from corral.store.agents import read_ledger
from corral.store.assignments import read_assignment, request_kernels
from corral.store.database import Database
from corral.store.kernel_reports import KernelReport, apply_kernel_reports
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


async def test_an_impossible_report_is_refused_alone(db: Database) -> None:
    """A move the kernel table forbids, or another agent's kernel, is refused, the rest applied."""
    agent, sid = await placed_session(db)
    (session,) = await SessionRepository(db).get([sid])
    kid = session.kernels[0].id
    outcome = await apply_kernel_reports(
        db, agent, [KernelReport(kid, K.PREPARING), KernelReport(kid, K.RUNNING)], NOW
    )
    assert outcome.refused == {kid: "cannot move from PREPARING to RUNNING"}
    assert outcome.moved == {kid: (K.SCHEDULED, K.PREPARING)}
    stranger = await apply_kernel_reports(
        db, AgentId("stranger"), [KernelReport(kid, K.PULLING)], NOW
    )
    assert stranger.refused == {kid: "not placed on agent stranger"}
    (unchanged,) = await SessionRepository(db).get([sid])
    assert unchanged.kernels[0].status is K.PREPARING


async def test_a_batch_resent_after_its_answer_was_lost_is_acknowledged_not_refused(
    db: Database,
) -> None:
    """PREPARED committed, answer lost, re-sent with RUNNING…TERMINATED once the kernel is
    CREATING: PREPARED is acknowledged as already applied, the rest applied, nothing refused."""
    agent, sid = await placed_session(db)
    (session,) = await SessionRepository(db).get([sid])
    kid = session.kernels[0].id
    lost = [KernelReport(kid, K.PREPARING), KernelReport(kid, K.PREPARED)]
    await apply_kernel_reports(db, agent, lost, NOW)  # committed; its answer never arrived
    await apply_kernel_reports(db, agent, [KernelReport(kid, K.CREATING)], NOW)  # StartSessions
    resent = [
        KernelReport(kid, K.PREPARED),
        KernelReport(kid, K.RUNNING),
        KernelReport(kid, K.TERMINATING),
        KernelReport(kid, K.TERMINATED, exit_code=0),
    ]
    outcome = await apply_kernel_reports(db, agent, resent, NOW)
    assert (outcome.refused, outcome.already) == ({}, 1)
    assert outcome.moved == {kid: (K.CREATING, K.TERMINATED)}
    # The whole batch once more (its answer lost again): every report acknowledged.
    again = await apply_kernel_reports(db, agent, resent, NOW)
    assert (again.refused, again.already, again.moved) == ({}, 4, {})
    # A kernel that ended is not started again: RUNNING alone is impossible now.
    impossible = await apply_kernel_reports(db, agent, [KernelReport(kid, K.RUNNING)], NOW)
    assert impossible.refused == {kid: "cannot move from TERMINATED to RUNNING"}
    assert (await read_ledger(db))[agent]["cpu"] == [4000, 0]


async def test_a_stale_report_in_a_batch_with_fresh_ones_drops_nothing(db: Database) -> None:
    """A report for a status a kernel passed is acknowledged; the kernel's later reports and
    other kernels' reports of the batch are applied."""
    (agent,) = await add_agents(db, [{"cpu": 4000}])
    (sid,) = await add_session_ids(db, await add_user(db), 1, cluster_size=2)
    await place_all(db, [sid], agent)
    (session,) = await SessionRepository(db).get([sid])
    x, y = (k.id for k in session.kernels)
    walk = [K.PREPARING, K.PREPARED, K.CREATING, K.RUNNING]
    await apply_kernel_reports(db, agent, [KernelReport(x, s) for s in walk], NOW)
    outcome = await apply_kernel_reports(
        db,
        agent,
        [
            KernelReport(x, K.PREPARED),  # stale
            KernelReport(y, K.PREPARING),
            KernelReport(x, K.PULLING, stage_failed=True),  # a stage long passed
            KernelReport(x, K.TERMINATED, exit_code=0),
        ],
        NOW,
    )
    assert (outcome.refused, outcome.already) == ({}, 2)
    assert outcome.moved == {x: (K.RUNNING, K.TERMINATED), y: (K.SCHEDULED, K.PREPARING)}
    (session,) = await SessionRepository(db).get([sid])
    assert [k.status for k in session.kernels] == [K.TERMINATED, K.PREPARING]


async def test_each_placement_is_an_attempt_and_an_earlier_ones_reports_change_nothing(
    db: Database,
) -> None:
    """Placing bumps the kernel's attempt (the assignment carries it); a report naming an
    earlier attempt is acknowledged and writes nothing; a later one is refused."""
    agent, _ = await placed_session(db)
    assignment = await read_assignment(db, agent)
    assert assignment is not None
    (kernel,) = assignment.kernels
    assert kernel.attempt == 1
    earlier = await apply_kernel_reports(
        db, agent, [KernelReport(kernel.id, K.PREPARING, attempt=0)], NOW
    )
    assert (earlier.moved, earlier.already, earlier.refused) == ({}, 1, {})
    later = await apply_kernel_reports(
        db, agent, [KernelReport(kernel.id, K.PREPARING, attempt=2)], NOW
    )
    assert later.refused == {kernel.id: "no placement 2 yet (the kernel's is 1)"}
    current = await apply_kernel_reports(
        db, agent, [KernelReport(kernel.id, K.PREPARING, attempt=1)], NOW
    )
    assert current.moved == {kernel.id: (K.SCHEDULED, K.PREPARING)}


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
    refused = await apply_kernel_reports(
        db, agent, [KernelReport(kid, K.RUNNING, stage_failed=True)], NOW
    )
    assert "failed stage" in refused.refused[kid]


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
