"""Moves that continue a commit, on SQLite and PostgreSQL: a placement asks its agents to
prepare in its own transaction, and the promotion of reported PREPARED kernels asks for the
start in its own, with the history, events and hints the separate runs wrote."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.coordination.hints import Hint
from corral.domain.failure_causes import FailureCause
from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId
from corral.handlers.sessions._agents import sort_stage_attempts
from corral.store.assignments import not_ready_for_stage
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.placements import commit_placements
from corral.store.sessions import SessionRepository
from corral.store.tables import agents, kernels
from tests.integration.coordination._harness import Cluster, make_cluster
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_sessions,
    add_user,
    plan_on,
    update_agents,
    update_sessions,
)

S, K = SessionStatus, KernelStatus
CPU4 = {"cpu": 4000}


async def revisions(c: Cluster) -> dict[AgentId, int]:
    async with c.db.read() as conn:
        rows = await conn.execute(sa.select(agents.c.id, agents.c.assignment_revision))
        return {AgentId(agent_id): revision for agent_id, revision in rows}


async def moves(c: Cluster, sid: SessionId) -> list[tuple[str, str | None]]:
    """The session's history rows: (phase, status moved to)."""
    return [(phase, to) for phase, _, to, _ in await c.moves_of(sid)]


async def status_events(c: Cluster, sid: SessionId) -> list[tuple[str, str, str]]:
    """The stored status events of the session: (from, to, reason)."""
    return [
        (e.payload["from"], e.payload["to"], e.payload["reason"])
        for e in await read_events(c.db, entity_id=str(sid))
        if "to" in e.payload
    ]


async def test_a_placement_asks_its_agents_to_prepare_in_its_own_commit(db: Database) -> None:
    """One scheduling run takes a two-node session to PREPARING: both moves in the history and
    the events under their own phases, each kernel asked to PREPARE, both agents woken, and
    PrepareSessions left with nothing to do."""
    c = await make_cluster(db, [CPU4] * 2)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    before = await revisions(c)

    assert await c.run("ScheduleNewSessions") == 1

    session = await c.session(sid)
    assert session.status is S.PREPARING
    assert [(k.status, k.desired_state, k.desired_generation) for k in session.kernels] == [
        (K.PREPARING, KernelIntent.PREPARE, 1)
    ] * 2
    woken = await revisions(c)
    assert all(woken[agent] > before[agent] for agent in c.agents)
    assert (await moves(c, sid))[-2:] == [
        ("ScheduleNewSessions", "SCHEDULED"),
        ("PrepareSessions", "PREPARING"),
    ]
    assert (await status_events(c, sid))[-2:] == [
        ("PENDING", "SCHEDULED", "ScheduleNewSessions"),
        ("SCHEDULED", "PREPARING", "PrepareSessions"),
    ]
    # The agents' long-polls are woken; PrepareSessions has nothing left to move.
    assert await c.hints.consume(Hint.ASSIGNMENTS.value)
    assert not await c.hints.consume(Hint.PREPARE.value)
    assert await c.run("PrepareSessions") == 0


async def test_prepared_reports_ask_for_the_start_in_their_promotion(db: Database) -> None:
    """Agents that promote on report (the manager's report path): once both kernels reported
    PREPARED, the same promotion takes the session on to CREATING and asks each kernel to RUN;
    StartSessions has nothing left to do, and the next reports run it."""
    c = await make_cluster(db, [CPU4] * 2)
    c.agent.promote = c.coordinator.promote_reported
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    await c.run("ScheduleNewSessions")
    before = await revisions(c)

    await c.agent.step()

    session = await c.session(sid)
    assert session.status is S.CREATING
    assert [(k.status, k.desired_state) for k in session.kernels] == [
        (K.CREATING, KernelIntent.RUN)
    ] * 2
    woken = await revisions(c)
    assert all(woken[agent] > before[agent] for agent in c.agents)
    assert (await moves(c, sid))[-2:] == [
        ("PromoteToPrepared", "PREPARED"),
        ("StartSessions", "CREATING"),
    ]
    assert (await status_events(c, sid))[-2:] == [
        ("PREPARING", "PREPARED", "PromoteToPrepared"),
        ("PREPARED", "CREATING", "StartSessions"),
    ]
    assert await c.run("StartSessions") == 0
    await c.agent.step()
    assert await c.status(sid) is S.RUNNING


async def test_a_session_with_a_lost_agent_stays_prepared_for_start_sessions(
    db: Database,
) -> None:
    """The start is not asked where StartSessions would not ask it: with one of its agents LOST
    when the last PREPARED report comes, the session stays PREPARED, the START hint set, and
    StartSessions' run gives the attempt up (back to PENDING, the agent remembered)."""
    c = await make_cluster(db, [CPU4] * 2)
    c.agent.promote = c.coordinator.promote_reported
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    await c.run("ScheduleNewSessions")
    lost = (await c.session(sid)).kernels[1].agent_id
    async with db.transaction() as conn:
        await conn.execute(agents.update().where(agents.c.id == lost).values(status="LOST"))
    await c.hints.consume(Hint.START.value)

    await c.agent.step()

    session = await c.session(sid)
    assert session.status is S.PREPARED
    assert {k.desired_state for k in session.kernels} == {KernelIntent.PREPARE}
    assert await c.hints.consume(Hint.START.value)
    assert await c.run("StartSessions") == 1
    assert await c.status(sid) is S.PENDING
    assert (await moves(c, sid))[-1] == ("StartSessions", "PENDING")


async def test_without_continued_stages_every_hop_is_its_tasks_run(db: Database) -> None:
    """`continue_stages=False`: the placement leaves the session SCHEDULED and the promotion
    leaves it PREPARED, each for its task."""
    c = await make_cluster(db, [CPU4], continue_stages=False)
    c.agent.promote = c.coordinator.promote_reported
    sid = await c.submit()
    await c.run("ScheduleNewSessions")
    assert await c.status(sid) is S.SCHEDULED
    assert await c.run("PrepareSessions") == 1
    await c.agent.step()
    assert await c.status(sid) is S.PREPARED
    assert await c.run("StartSessions") == 1
    assert await c.status(sid) is S.CREATING


@pytest.mark.parametrize("agent_status", ["ALIVE", "LOST", "TERMINATED"])
async def test_the_start_is_asked_in_the_promotion_exactly_where_start_sessions_would_ask(
    db: Database, agent_status: str
) -> None:
    """`not_ready_for_stage` (the promotion's one query) and `sort_stage_attempts` (the
    StartSessions task's verdict) hold the same rule: for every mix of the second agent's
    status, a failed stage and an ended kernel, they pick out the same PREPARED sessions."""
    first, second = await add_agents(db, [CPU4, {"cpu": 64_000}])
    owner = await add_user(db)
    cases = [(failed, ended) for failed in (False, True) for ended in (False, True)]
    made = await add_sessions(db, owner, [(2, {"cpu": 1000})] * len(cases))
    outcome = await commit_placements(db, plan_on(made, [first, second]), NOW)
    assert len(outcome.placed) == len(cases)
    ids = [s.id for s in made]
    await update_sessions(db, ids, status=S.PREPARED.value)
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update().where(kernels.c.session_id.in_(ids)).values(status=K.PREPARED.value)
        )
        for sid, (failed, ended) in zip(ids, cases, strict=True):
            second_kernel = sa.and_(kernels.c.session_id == sid, kernels.c.cluster_index == 1)
            values: dict[str, str] = {}
            if failed:
                values["stage_failure"] = FailureCause.KERNEL_START_FAILURE.value
            if ended:
                values["status"] = K.ERROR.value
            if values:
                await conn.execute(kernels.update().where(second_kernel).values(**values))
    await update_agents(db, [second], status=agent_status)

    targets = await SessionRepository(db).get(ids)
    judged = await sort_stage_attempts(db, targets, S.PREPARED)
    async with db.transaction() as conn:
        blocked = await not_ready_for_stage(conn, db.dialect, ids)

    assert blocked == set(judged.failures)
    assert set(judged.successes) == set(ids) - blocked
