"""commit_placements on SQLite and PostgreSQL: all or nothing, overcommit guard, stale plans."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId
from corral.store.agents import NewAgent, apply_slot_deltas, insert_agents, read_ledger
from corral.store.database import Database
from corral.store.placements import KernelPlacement, SessionPlacement, commit_placements
from corral.store.sessions import SessionRepository, StatusChange
from corral.store.tables import agents
from tests.integration.store.test_sessions_repo import NOW, make_sessions, make_user


def plan_on(sessions: list, agent_ids: list[AgentId]) -> list[SessionPlacement]:  # type: ignore[type-arg]
    """Place kernel i of each session on agent_ids[i % len(agent_ids)]."""
    return [
        SessionPlacement(
            s.id,
            tuple(
                KernelPlacement(k.id, agent_ids[i % len(agent_ids)], k.requested_slots)
                for i, k in enumerate(s.kernels)
            ),
        )
        for s in sessions
    ]


async def test_commit_occupies_slots_and_schedules_sessions_and_kernels(db: Database) -> None:
    """Placed sessions and kernels are SCHEDULED on their agent and the ledger counts them."""
    repo = SessionRepository(db)
    ids = await make_sessions(repo, await make_user(db), 2, cpu_milli=1500)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 4000, "mem": 10**12})], NOW)
    outcome = await commit_placements(db, plan_on(await repo.get(ids), [AgentId("a1")]), NOW)
    assert sorted(outcome.placed) == sorted(ids)
    assert outcome.no_longer_fits == [] and outcome.stale == []
    for session in await repo.get(ids):
        assert session.status is SessionStatus.SCHEDULED
        assert [(k.status, k.agent_id, k.occupied_slots) for k in session.kernels] == [
            (KernelStatus.SCHEDULED, "a1", {"cpu": 1500})
        ]
    assert (await read_ledger(db))["a1"] == {"cpu": [4000, 3000], "mem": [10**12, 0]}


async def test_sessions_that_no_longer_fit_stay_pending_untouched(db: Database) -> None:
    """When the plan overestimates free capacity, later sessions stay PENDING with no history."""
    repo = SessionRepository(db)
    created = await make_sessions(repo, await make_user(db), 3, cpu_milli=2000)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 4000})], NOW)
    snapshot = await repo.get(created)
    ids = [s.id for s in snapshot]  # plan order: the commit accepts in this order
    outcome = await commit_placements(db, plan_on(snapshot, [AgentId("a1")]), NOW)
    assert outcome.placed == ids[:2]
    assert outcome.no_longer_fits == ids[2:]
    [last] = await repo.get(ids[2:])
    assert last.status is SessionStatus.PENDING and last.kernels[0].agent_id is None
    assert (await read_ledger(db))["a1"]["cpu"] == [4000, 4000]


async def test_multi_node_session_is_placed_all_or_nothing(db: Database) -> None:
    """If one kernel's agent has no room, none of the session's kernels are placed."""
    repo = SessionRepository(db)
    [sid] = await make_sessions(repo, await make_user(db), 1, cluster_size=2, cpu_milli=2000)
    await insert_agents(
        db,
        [
            NewAgent(AgentId("a1"), "h1", {"cpu": 4000}),
            NewAgent(AgentId("a2"), "h2", {"cpu": 1000}),
        ],
        NOW,
    )
    outcome = await commit_placements(
        db, plan_on(await repo.get([sid]), [AgentId("a1"), AgentId("a2")]), NOW
    )
    assert outcome.placed == [] and outcome.no_longer_fits == [sid]
    ledger = await read_ledger(db)
    assert ledger["a1"]["cpu"][1] == 0 and ledger["a2"]["cpu"][1] == 0


async def test_a_slot_the_agent_lacks_does_not_fit(db: Database) -> None:
    """A request for a slot the agent does not have (capacity 0) is not placed there."""
    repo = SessionRepository(db)
    owner = await make_user(db)
    [sid] = await make_sessions(repo, owner, 1)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"mem": 10**9})], NOW)
    outcome = await commit_placements(db, plan_on(await repo.get([sid]), [AgentId("a1")]), NOW)
    assert outcome.no_longer_fits == [sid]


async def test_agents_that_are_not_alive_or_drained_take_nothing(db: Database) -> None:
    """Placements on a LOST or unschedulable agent are refused at commit time."""
    repo = SessionRepository(db)
    ids = await make_sessions(repo, await make_user(db), 2)
    await insert_agents(
        db,
        [
            NewAgent(AgentId("lost"), "h1", {"cpu": 4000}),
            NewAgent(AgentId("drained"), "h2", {"cpu": 4000}),
        ],
        NOW,
    )
    async with db.transaction() as conn:
        await conn.execute(agents.update().where(agents.c.id == "lost").values(status="LOST"))
        await conn.execute(
            agents.update().where(agents.c.id == "drained").values(schedulable=False)
        )
    sessions = await repo.get(ids)
    plan = plan_on(sessions[:1], [AgentId("lost")]) + plan_on(sessions[1:], [AgentId("drained")])
    outcome = await commit_placements(db, plan, NOW)
    assert outcome.placed == [] and sorted(outcome.no_longer_fits) == sorted(ids)


async def test_sessions_no_longer_pending_are_stale(db: Database) -> None:
    """A session cancelled after the snapshot is reported stale and takes no slots."""
    repo = SessionRepository(db)
    created = await make_sessions(repo, await make_user(db), 2)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 4000})], NOW)
    snapshot = await repo.get(created)
    ids = [s.id for s in snapshot]
    await repo.apply(
        [
            StatusChange(
                ids[:1],
                "cancel",
                SchedulingResult.SUCCESS,
                frozenset({SessionStatus.PENDING}),
                TransitionStatus(SessionStatus.CANCELLED, KernelStatus.CANCELLED),
            )
        ],
        NOW,
    )
    outcome = await commit_placements(db, plan_on(snapshot, [AgentId("a1")]), NOW)
    assert outcome.stale == ids[:1] and outcome.placed == ids[1:]
    assert (await read_ledger(db))["a1"]["cpu"] == [4000, 1000]


async def test_overcommit_is_rejected_by_the_database_itself(db: Database) -> None:
    """A delta past capacity violates the CHECK constraint and rolls the transaction back."""
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 1000})], NOW)
    with pytest.raises(sa.exc.IntegrityError):
        async with db.transaction() as conn:
            await apply_slot_deltas(conn, {AgentId("a1"): {"cpu": 1001}})
    with pytest.raises(sa.exc.IntegrityError):
        async with db.transaction() as conn:
            await apply_slot_deltas(conn, {AgentId("a1"): {"cpu": -1}})
    assert (await read_ledger(db))["a1"]["cpu"] == [1000, 0]
