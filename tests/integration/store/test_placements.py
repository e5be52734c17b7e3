"""commit_placements on SQLite and PostgreSQL: all or nothing, overcommit guard, stale plans."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import pytest
import sqlalchemy as sa

from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.store import tables
from corral.store.agents import NewAgent, apply_slot_deltas, insert_agents, read_ledger
from corral.store.database import Database
from corral.store.placements import SessionPlacement, commit_placement_batches, commit_placements
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from tests.integration.store._factories import (
    NOW,
    PREPARE,
    RELEASE,
    add_agents,
    add_session_ids,
    add_sessions,
    add_user,
    assert_slots_consistent,
    on,
    placement,
    plan_on,
)


async def test_commit_occupies_slots_and_schedules_sessions_and_kernels(db: Database) -> None:
    """Placed sessions and kernels are SCHEDULED on their agent and the ledger counts them."""
    repo = SessionRepository(db)
    ids = await add_session_ids(db, await add_user(db), 2, cpu_milli=1500)
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


async def test_the_commit_tells_its_callback_the_placed_sessions_and_their_owners(
    db: Database,
) -> None:
    """`on_committed` gets exactly the sessions placed, each with its owner, in the commit."""
    repo = SessionRepository(db)
    alice, bob = await add_user(db), await add_user(db)
    ids = [
        *await add_session_ids(db, alice, 1, cpu_milli=1000),
        *await add_session_ids(db, bob, 2, cpu_milli=1000),
    ]
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 2000})], NOW)
    seen: list[tuple[list[SessionId], dict[SessionId, UserId]]] = []

    async def record(_conn: object, placed: list[SessionId], owners: object) -> None:
        assert isinstance(owners, Mapping)
        seen.append((list(placed), {sid: owners[sid] for sid in placed}))

    outcome = await commit_placements(
        db, plan_on(await repo.get(ids), [AgentId("a1")]), NOW, on_committed=record
    )

    owner_of = {s.id: s.owner_id for s in await repo.get(ids)}
    assert len(outcome.placed) == 2 and len(outcome.no_longer_fits) == 1
    assert seen == [(outcome.placed, {sid: owner_of[sid] for sid in outcome.placed})]


async def test_sessions_that_no_longer_fit_stay_pending_untouched(db: Database) -> None:
    """When the plan overestimates free capacity, later sessions stay PENDING with no history."""
    repo = SessionRepository(db)
    created = await add_session_ids(db, await add_user(db), 3, cpu_milli=2000)
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
    [sid] = await add_session_ids(db, await add_user(db), 1, cluster_size=2, cpu_milli=2000)
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
    owner = await add_user(db)
    [sid] = await add_session_ids(db, owner, 1)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"mem": 10**9})], NOW)
    outcome = await commit_placements(db, plan_on(await repo.get([sid]), [AgentId("a1")]), NOW)
    assert outcome.no_longer_fits == [sid]


async def test_agents_that_are_not_alive_or_drained_take_nothing(db: Database) -> None:
    """Placements on a LOST or unschedulable agent are refused at commit time."""
    repo = SessionRepository(db)
    ids = await add_session_ids(db, await add_user(db), 2)
    await insert_agents(
        db,
        [
            NewAgent(AgentId("lost"), "h1", {"cpu": 4000}),
            NewAgent(AgentId("drained"), "h2", {"cpu": 4000}),
        ],
        NOW,
    )
    async with db.transaction() as conn:
        await conn.execute(
            tables.agents.update().where(tables.agents.c.id == "lost").values(status="LOST")
        )
        await conn.execute(
            tables.agents.update().where(tables.agents.c.id == "drained").values(schedulable=False)
        )
    sessions = await repo.get(ids)
    plan = plan_on(sessions[:1], [AgentId("lost")]) + plan_on(sessions[1:], [AgentId("drained")])
    outcome = await commit_placements(db, plan, NOW)
    assert outcome.placed == [] and sorted(outcome.no_longer_fits) == sorted(ids)


async def test_sessions_no_longer_pending_are_stale(db: Database) -> None:
    """A session cancelled after the snapshot is reported stale and takes no slots."""
    repo = SessionRepository(db)
    created = await add_session_ids(db, await add_user(db), 2)
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


@pytest.mark.parametrize("delta", [3001, -1001], ids=["overcommit", "negative"])
async def test_slot_delta_past_the_bounds_is_rejected_by_the_database(
    db: Database, delta: int
) -> None:
    """A raw delta that overcommits or goes negative fails its transaction with IntegrityError."""
    agents = await add_agents(db, [{"cpu": 4000, "mem": 8000}])
    (agent,) = agents
    async with db.transaction() as conn:
        await apply_slot_deltas(conn, {agent: {"cpu": 1000}})
    before = await read_ledger(db)
    with pytest.raises(sa.exc.IntegrityError):
        async with db.transaction() as conn:
            await apply_slot_deltas(conn, {agent: {"mem": 2000}})
            await apply_slot_deltas(conn, {agent: {"cpu": delta}})
    assert await read_ledger(db) == before
    assert before[agent] == {"cpu": [4000, 1000], "mem": [8000, 0]}


# Regression: found while writing the store properties (test_store_properties.py), now fixed.
async def test_placing_a_session_whose_kernel_ended_charges_no_phantom_slots(db: Database) -> None:
    """A PENDING session whose kernel already ended is not charged for a kernel it cannot place."""
    repo = SessionRepository(db)
    agents = await add_agents(db, [{"cpu": 4000}, {"cpu": 4000}])
    first, second = sorted(agents)
    (session,) = await add_sessions(db, await add_user(db), [(1, {"cpu": 1000})])
    await commit_placements(db, [placement(session, [first])], NOW)
    # The kernel fails while preparing (an agent report: session unchanged, kernel → ERROR),
    # then PrepareSessions gives up: the session goes back to PENDING, the ERROR kernel stays.
    kernel_failed = StatusChange(
        (session.id,),
        "AgentReport",
        SchedulingResult.SUCCESS,
        frozenset({SessionStatus.PREPARING}),
        TransitionStatus(None, KernelStatus.ERROR),
    )
    await repo.apply([on(PREPARE, [session.id])], NOW)
    await repo.apply([kernel_failed], NOW)
    await repo.apply([on(RELEASE, [session.id])], NOW)
    await assert_slots_consistent(db, agents, [session.id])

    outcome = await commit_placements(db, [placement(session, [second])], NOW)
    assert outcome.stale == [session.id] and outcome.placed == []
    await assert_slots_consistent(db, agents, [session.id])


async def test_each_kernel_gets_the_agent_of_its_cluster_index(db: Database) -> None:
    """Kernel i of a multi-node session goes to the agent the plan names for index i."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1, cluster_size=3, cpu_milli=1000)
    names = [AgentId("a1"), AgentId("a2"), AgentId("a3")]
    await insert_agents(db, [NewAgent(a, "h", {"cpu": 4000}) for a in names], NOW)
    [session] = await repo.get([sid])
    # The plan lists the kernels out of order; each must still land by its own index.
    shuffled = placement(session, [names[2], names[0], names[1]])
    reordered = type(shuffled)(sid, tuple(reversed(shuffled.kernels)))
    outcome = await commit_placements(db, [reordered], NOW)
    assert outcome.placed == [sid]
    [after] = await repo.get([sid])
    assert [(k.cluster_index, k.agent_id) for k in after.kernels] == [
        (0, "a3"),
        (1, "a1"),
        (2, "a2"),
    ]
    assert all(k.occupied_slots == k.requested_slots for k in after.kernels)
    history = tables.kernel_history.c
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(history.kernel_id, history.from_status, history.to_status, history.message)
            .where(history.session_id == sid)
            .order_by(history.id)
        )
        recorded = {kernel_id: tuple(rest) for kernel_id, *rest in rows}
    assert recorded == {
        k.id: ("PENDING", "SCHEDULED", f"placed on {k.agent_id}") for k in after.kernels
    }


async def test_a_plan_naming_kernel_indexes_the_session_lacks_writes_nothing(
    db: Database,
) -> None:
    """Indexes must be exactly 0..n-1: anything else is refused before a row is written."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1, cluster_size=2, cpu_milli=1000)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h", {"cpu": 4000})], NOW)
    [session] = await repo.get([sid])
    good = placement(session, [AgentId("a1"), AgentId("a1")])
    wrong = type(good)(
        sid, (good.kernels[0], type(good.kernels[1])(5, AgentId("a1"), {"cpu": 1000}))
    )
    with pytest.raises(ValueError, match="kernel indexes"):
        await commit_placements(db, [wrong], NOW)
    [after] = await repo.get([sid])
    assert after.status is SessionStatus.PENDING
    assert all(k.status is KernelStatus.PENDING and k.agent_id is None for k in after.kernels)
    assert (await read_ledger(db))["a1"]["cpu"] == [4000, 0]


async def test_a_later_batch_fits_only_what_the_earlier_batches_left(db: Database) -> None:
    """Batches of one commit share the agents' room: the second cannot take the first's."""
    repo = SessionRepository(db)
    first, second, third = await add_session_ids(db, await add_user(db), 3, cpu_milli=2000)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 5000})], NOW)
    on_a1 = {s.id: plan_on([s], [AgentId("a1")]) for s in await repo.get([first, second, third])}

    async def batches() -> AsyncIterator[list[SessionPlacement]]:
        yield [*on_a1[first], *on_a1[second]]
        yield on_a1[third]

    outcome = await commit_placement_batches(
        db, batches(), NOW, agent_ids=[AgentId("a1")], session_ids=[first, second, third]
    )
    assert (outcome.placed, outcome.no_longer_fits) == ([first, second], [third])
    assert (await read_ledger(db))["a1"]["cpu"] == [5000, 4000]
    assert (await repo.get([third]))[0].status is SessionStatus.PENDING


async def test_a_batch_naming_a_session_not_locked_first_places_nothing_of_it(
    db: Database,
) -> None:
    """Only sessions locked and checked before the batches may be written: others are stale."""
    repo = SessionRepository(db)
    locked, unlocked = await add_session_ids(db, await add_user(db), 2)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 4000})], NOW)

    async def batches() -> AsyncIterator[list[SessionPlacement]]:
        yield plan_on(await repo.get([locked, unlocked]), [AgentId("a1")])

    outcome = await commit_placement_batches(
        db, batches(), NOW, agent_ids=[AgentId("a1")], session_ids=[locked]
    )
    assert (outcome.placed, outcome.stale) == ([locked], [unlocked])
    assert (await repo.get([unlocked]))[0].status is SessionStatus.PENDING
