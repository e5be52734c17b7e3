"""Started kernels their agents went quiet about: asked, answered, or failed (both backends)."""

from __future__ import annotations

from datetime import timedelta

from corral.domain.status import KernelStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store.agents import read_ledger
from corral.store.assignments import read_assignment
from corral.store.database import Database
from corral.store.kernel_checks import check_quiet_kernels
from corral.store.kernel_reports import KernelReport, apply_kernel_reports
from corral.store.sessions import SessionRepository
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_session_ids,
    add_user,
    place_all,
    update_agents,
)

K = KernelStatus
BOUND = timedelta(minutes=10)
ANSWER = timedelta(seconds=30)


async def running_kernel(db: Database) -> tuple[AgentId, KernelId, SessionId]:
    """One kernel placed on a fresh agent and reported RUNNING at NOW."""
    (agent,) = await add_agents(db, [{"cpu": 4000}])
    (sid,) = await add_session_ids(db, await add_user(db), 1)
    await place_all(db, [sid], agent)
    (session,) = await SessionRepository(db).get([sid])
    kid = session.kernels[0].id
    walk = [K.PREPARING, K.PREPARED, K.CREATING, K.RUNNING]
    await apply_kernel_reports(db, agent, [KernelReport(kid, s) for s in walk], NOW)
    return agent, kid, sid


async def check(db: Database, at: timedelta) -> tuple[set[KernelId], set[KernelId]]:
    """Run a check at NOW + `at`; the kernels asked and failed."""
    now = NOW + at
    found = await check_quiet_kernels(db, {K.RUNNING: now - BOUND}, now - ANSWER, now)
    return set(found.asked), set(found.failed)


async def test_a_quiet_running_kernel_is_asked_and_an_answer_clears_the_question(
    db: Database,
) -> None:
    """Quiet past its bound: asked once (the assignment shows it, at a new revision); the
    agent's report of its status answers; quiet that long again, it is asked again."""
    agent, kid, _ = await running_kernel(db)
    assert await check(db, BOUND - timedelta(seconds=1)) == (set(), set())
    before = await read_assignment(db, agent)
    assert before is not None and not before.kernels[0].asked
    assert await check(db, BOUND + timedelta(seconds=1)) == ({kid}, set())
    assert await check(db, BOUND + timedelta(seconds=2)) == (set(), set())  # asked already
    after = await read_assignment(db, agent)
    assert after is not None and after.kernels[0].asked
    assert after.revision > before.revision

    answered_at = NOW + BOUND + timedelta(seconds=5)
    answer = await apply_kernel_reports(db, agent, [KernelReport(kid, K.RUNNING)], answered_at)
    assert (answer.already, answer.refused) == (1, {})
    settled = await read_assignment(db, agent)
    assert settled is not None and not settled.kernels[0].asked
    assert await check(db, BOUND + ANSWER * 2) == (set(), set())  # heard since
    assert await check(db, BOUND * 2 + timedelta(seconds=6)) == ({kid}, set())


async def test_an_unanswered_kernel_fails_with_agent_lost_and_gives_its_slots_back(
    db: Database,
) -> None:
    """Asked and unanswered past the answer bound: ERROR agent_lost, slots released; a
    kernel on an agent that is not ALIVE is left to the lost sweep."""
    agent, kid, sid = await running_kernel(db)
    assert await check(db, BOUND + timedelta(seconds=1)) == ({kid}, set())
    assert await check(db, BOUND + ANSWER) == (set(), set())
    assert await check(db, BOUND + ANSWER + timedelta(seconds=2)) == (set(), {kid})
    (session,) = await SessionRepository(db).get([sid])
    kernel = session.kernels[0]
    assert (kernel.status, kernel.failure_cause) == (K.ERROR, "agent_lost")
    assert (await read_ledger(db))[agent]["cpu"] == [4000, 0]

    other, _, _ = await running_kernel(db)
    await update_agents(db, [other], status="LOST")
    assert await check(db, BOUND * 3) == (set(), set())
