"""schedule_group on SQLite and PostgreSQL: from the stored snapshot to committed placements."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

import pytest
import sqlalchemy as sa

from corral.domain.outcome import SessionResult
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import ADMIN_ROLE, AgentId, SessionId
from corral.scheduler.planner import NO_CAPACITY, WAITING_BEHIND
from corral.scheduler.scheduler import schedule_group
from corral.scheduler.types import Outcome, QueuePage
from corral.scheduler.validators import (
    DEPENDENCY_FAILED,
    DEPENDENCY_PENDING,
    OWNER_SESSION_LIMIT,
    REQUEST_TOO_LARGE,
)
from corral.store.agents import NewAgent, insert_agents, read_ledger
from corral.store.database import Database
from corral.store.migrate import downgrade, upgrade
from corral.store.placements import PHASE
from corral.store.sessions import SessionRepository
from corral.store.tables import kernels, sessions
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_dependent,
    add_group,
    add_session_ids,
    add_sessions,
    add_user,
    assert_kernels_follow_sessions,
    assert_slots_consistent,
    history_rows,
    number_of,
    set_group_options,
    update_agents,
    update_sessions,
)

S = SessionStatus
LATER = NOW + timedelta(minutes=1)
PLACED_ROW = ("SUCCESS", "SCHEDULED", 1)


async def ask_of_kernel(
    db: Database, session_id: SessionId, index: int, slots: dict[str, int]
) -> None:
    """Make kernel `index` of the session request `slots` (sessions are made with one request)."""
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update()
            .where(kernels.c.session_id == session_id, kernels.c.cluster_index == index)
            .values(requested_slots=slots)
        )


async def statuses(db: Database, ids: Collection[SessionId]) -> dict[SessionId, SessionStatus]:
    """The current status of each of these sessions."""
    return {s.id: s.status for s in await SessionRepository(db).get(ids)}


async def test_pass_places_what_fits_and_commits_it(db: Database) -> None:
    """Placed sessions and kernels are SCHEDULED on agents, charged in the ledger, with history."""
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    agents = await add_agents(db, [{"cpu": 4000}, {"cpu": 4000}])
    pair, single, left_out = await add_sessions(
        db, owner, [(2, {"cpu": 3000}), (1, {"cpu": 1000}), (1, {"cpu": 2000})]
    )
    await update_sessions(db, [pair.id], priority=3)
    await update_sessions(db, [single.id], priority=2)

    result = await schedule_group(db, "default", LATER)

    assert sorted(result.committed.placed) == sorted([pair.id, single.id])
    waiting = result.plan.decisions[left_out.id]
    assert (waiting.outcome, waiting.code) == (Outcome.WAITING, NO_CAPACITY)
    found = await assert_slots_consistent(db, agents, [pair.id, single.id, left_out.id])
    assert_kernels_follow_sessions(found)
    by_id = {s.id: s for s in found}
    for sid in (pair.id, single.id):
        assert by_id[sid].status is S.SCHEDULED
        assert by_id[sid].status_changed_at == LATER
        assert all(k.status is KernelStatus.SCHEDULED for k in by_id[sid].kernels)
    assert len({k.agent_id for k in by_id[pair.id].kernels}) == 2
    assert by_id[left_out.id].status is S.PENDING
    ledger = await read_ledger(db)
    assert sum(ledger[a]["cpu"][1] for a in agents) == 7000
    rows = await history_rows(db, PHASE)
    assert sorted(rows) == sorted([(pair.id, *PLACED_ROW), (single.id, *PLACED_ROW)])


def queue_page(paged: bool) -> QueuePage | None:
    """A first page of the queue, as the scheduling handler reads it, or None (the pass reads
    every candidate)."""
    return QueuePage(100) if paged else None


@pytest.mark.parametrize("paged", [False, True], ids=["read", "paged"])
async def test_sessions_not_due_or_deactivated_are_not_candidates(
    db: Database, paged: bool
) -> None:
    """A future starts_at or requeue_at, or requeue_active false, keeps a session out, whether
    the pass reads all its candidates or a page of its queue."""
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    ids = await add_session_ids(db, owner, 6)
    late_start, late_requeue, deactivated, started, requeued, plain = ids
    await update_sessions(db, [late_start], starts_at=LATER + timedelta(seconds=1))
    await update_sessions(db, [late_requeue], requeue_at=LATER + timedelta(seconds=1))
    await update_sessions(db, [deactivated], requeue_active=False)
    await update_sessions(db, [started], starts_at=LATER)
    await update_sessions(db, [requeued], requeue_at=NOW)

    result = await schedule_group(db, "default", LATER, page=queue_page(paged))

    assert sorted(result.plan.order) == sorted([started, requeued, plain])
    assert sorted(result.committed.placed) == sorted([started, requeued, plain])
    found = await statuses(db, ids)
    assert [found[sid] for sid in (late_start, late_requeue, deactivated)] == [S.PENDING] * 3


@pytest.mark.parametrize("paged", [False, True], ids=["read", "paged"])
async def test_other_groups_sessions_and_agents_are_left_alone(db: Database, paged: bool) -> None:
    """A pass over one group neither places another group's sessions nor uses its agents,
    whether it reads all its candidates or a page of its queue."""
    await add_group(db, "other")
    owner = await add_user(db)
    [home] = await add_agents(db, [{"cpu": 2000}])
    stranger = AgentId("agent-other")
    await insert_agents(
        db, [NewAgent(stranger, "10.9.0.1:6001", {"cpu": 16000}, resource_group="other")], NOW
    )
    fits, too_large = await add_sessions(db, owner, [(1, {"cpu": 1000}), (1, {"cpu": 8000})])
    [foreign] = await add_session_ids(db, owner, 1, group="other")

    result = await schedule_group(db, "default", LATER, page=queue_page(paged))

    assert result.committed.placed == [fits.id]
    assert result.plan.decisions[too_large.id].code == REQUEST_TOO_LARGE
    assert foreign not in result.plan.decisions
    assert (await statuses(db, [foreign]))[foreign] is S.PENDING
    assert (await read_ledger(db))[stranger]["cpu"] == [16000, 0]
    [placed] = await SessionRepository(db).get([fits.id])
    assert placed.kernels[0].agent_id == home

    other = await schedule_group(db, "other", LATER)
    assert other.committed.placed == [foreign]
    [moved] = await SessionRepository(db).get([foreign])
    assert moved.kernels[0].agent_id == stranger


@pytest.mark.parametrize(("options", "agents_used"), [({}, 1), ({"selector": "dispersed"}, 2)])
async def test_selector_is_read_from_group_options(
    db: Database, options: dict[str, str], agents_used: int
) -> None:
    """The stored selector decides: concentrated (default) packs, dispersed spreads."""
    await set_group_options(db, "default", options)
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 4000}, {"cpu": 4000}])
    ids = await add_session_ids(db, owner, 2)

    result = await schedule_group(db, "default", LATER)

    assert sorted(result.committed.placed) == sorted(ids)
    found = await SessionRepository(db).get(ids)
    assert len({k.agent_id for s in found for k in s.kernels}) == agents_used


@pytest.mark.parametrize("ordering", ["strict", "best_effort"])
async def test_ordering_is_read_from_group_options(db: Database, ordering: str) -> None:
    """Strict ordering holds small sessions behind a head that does not fit; best effort not."""
    await set_group_options(db, "default", {"ordering": ordering})
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    await add_agents(db, [{"cpu": 4000}])
    [holder] = await add_session_ids(db, owner, 1)
    assert (await schedule_group(db, "default", NOW)).committed.placed == [holder]
    head, small = await add_sessions(db, owner, [(1, {"cpu": 4000}), (1, {"cpu": 1000})])
    await update_sessions(db, [head.id], priority=1)

    result = await schedule_group(db, "default", LATER)

    decisions = result.plan.decisions
    assert (decisions[head.id].outcome, decisions[head.id].code) == (Outcome.WAITING, NO_CAPACITY)
    if ordering == "strict":
        assert decisions[small.id].outcome is Outcome.BLOCKED
        assert decisions[small.id].code == WAITING_BEHIND
        assert result.committed.placed == []
    else:
        assert decisions[small.id].outcome is Outcome.PLACED
        assert result.committed.placed == [small.id]


async def test_owner_session_limit_is_read_from_group_options(db: Database) -> None:
    """max_sessions_per_owner=1 places one session of an owner per pass; other owners go on."""
    await set_group_options(db, "default", {"max_sessions_per_owner": 1})
    alice, bob = await add_user(db), await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    alices = await add_session_ids(db, alice, 2)
    [bobs] = await add_session_ids(db, bob, 1)

    result = await schedule_group(db, "default", LATER)

    placed = set(result.committed.placed)
    assert bobs in placed and len(placed & set(alices)) == 1
    [held_back] = set(alices) - placed
    decision = result.plan.decisions[held_back]
    assert (decision.outcome, decision.code) == (Outcome.WAITING, OWNER_SESSION_LIMIT)


async def test_owner_usage_from_the_database_counts_in_the_next_pass(db: Database) -> None:
    """A session placed in an earlier pass counts against its owner's limit in the next one."""
    await set_group_options(db, "default", {"max_sessions_per_owner": 1})
    alice, bob = await add_user(db), await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    [first] = await add_session_ids(db, alice, 1)
    assert (await schedule_group(db, "default", NOW)).committed.placed == [first]
    [second] = await add_session_ids(db, alice, 1)
    [bobs] = await add_session_ids(db, bob, 1)

    result = await schedule_group(db, "default", LATER)

    assert result.committed.placed == [bobs]
    decision = result.plan.decisions[second]
    assert (decision.outcome, decision.code) == (Outcome.WAITING, OWNER_SESSION_LIMIT)
    assert "already has 1 session(s)" in decision.message


@pytest.mark.parametrize("status", [S.PENDING, S.RUNNING])
async def test_session_waits_while_its_dependency_has_not_ended(
    db: Database, status: SessionStatus
) -> None:
    """A dependency still PENDING or RUNNING keeps its dependant PENDING (dependency_pending)."""
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    [dependency] = await add_session_ids(db, owner, 1)
    await update_sessions(db, [dependency], status=status.value)
    dependant = await add_dependent(db, owner, [dependency])

    result = await schedule_group(db, "default", LATER)

    decision = result.plan.decisions[dependant]
    assert (decision.outcome, decision.code) == (Outcome.WAITING, DEPENDENCY_PENDING)
    assert f"session {await number_of(db, dependency)}" in decision.message
    handled = result.handler_result()
    assert dependant in handled.skipped and not handled.notes[dependant].permanent
    assert (await statuses(db, [dependant]))[dependant] is S.PENDING


@pytest.mark.parametrize(
    ("status", "result"),
    [(S.ERROR, None), (S.TERMINATED, SessionResult.FAILURE), (S.CANCELLED, None)],
)
async def test_session_fails_when_its_dependency_ended_badly(
    db: Database, status: SessionStatus, result: str | None
) -> None:
    """A dependency that ended without success fails its dependant permanently."""
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    [dependency] = await add_session_ids(db, owner, 1)
    await update_sessions(db, [dependency], status=status.value, result=result)
    dependant = await add_dependent(db, owner, [dependency])

    handled = (await schedule_group(db, "default", LATER)).handler_result()

    assert handled.failures == [dependant] and handled.successes == []
    note = handled.notes[dependant]
    assert (note.code, note.permanent) == (DEPENDENCY_FAILED, True)
    assert f"session {await number_of(db, dependency)}" in note.message


async def test_session_runs_once_its_dependency_terminated_successfully(db: Database) -> None:
    """A dependency TERMINATED with result success lets its dependant be placed."""
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    [dependency] = await add_session_ids(db, owner, 1)
    await update_sessions(db, [dependency], status=S.TERMINATED.value, result=SessionResult.SUCCESS)
    dependant = await add_dependent(db, owner, [dependency])

    result = await schedule_group(db, "default", LATER)

    assert result.committed.placed == [dependant]
    assert result.handler_result().successes == [dependant]


async def test_handler_result_sorts_every_outcome_with_a_reason(db: Database) -> None:
    """Placed: successes; failed: failures (permanent); waiting, blocked: skipped; all noted."""
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    await add_agents(db, [{"cpu": 4000}])
    placed, too_large, head, behind = await add_sessions(
        db, owner, [(1, {"cpu": 1000}), (1, {"cpu": 8000}), (1, {"cpu": 4000}), (1, {"cpu": 1000})]
    )
    waits_for_head = await add_dependent(db, owner, [head.id])
    for priority, session in enumerate((behind, head, too_large, placed), start=2):
        await update_sessions(db, [session.id], priority=priority)

    result = await schedule_group(db, "default", LATER)
    handled = result.handler_result()

    outcomes = {sid: (d.outcome, d.code) for sid, d in result.plan.decisions.items()}
    assert outcomes == {
        placed.id: (Outcome.PLACED, ""),
        too_large.id: (Outcome.FAILED, REQUEST_TOO_LARGE),
        head.id: (Outcome.WAITING, NO_CAPACITY),
        behind.id: (Outcome.BLOCKED, WAITING_BEHIND),
        waits_for_head: (Outcome.WAITING, DEPENDENCY_PENDING),
    }
    assert handled.successes == [placed.id]
    assert handled.failures == [too_large.id]
    assert sorted(handled.skipped) == sorted([head.id, behind.id, waits_for_head])
    assert set(handled.notes) == {too_large.id, head.id, behind.id, waits_for_head}
    for sid, note in handled.notes.items():
        assert note.code and note.message
        assert note.permanent is (sid == too_large.id)


async def test_lost_and_drained_agents_receive_nothing(db: Database) -> None:
    """Only ALIVE, schedulable agents take placements; lost and drained ones stay empty."""
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 4000}] * 3)
    lost, drained, alive = sorted(agents)
    await update_agents(db, [lost], status="LOST")
    await update_agents(db, [drained], schedulable=False)
    ids = await add_session_ids(db, owner, 3, cpu_milli=3000)

    result = await schedule_group(db, "default", LATER)

    [placed] = result.committed.placed
    [session] = await SessionRepository(db).get([placed])
    assert session.kernels[0].agent_id == alive
    rest = sorted(d.outcome for sid, d in result.plan.decisions.items() if sid != placed)
    assert rest == sorted([Outcome.WAITING, Outcome.BLOCKED])
    ledger = await read_ledger(db)
    assert ledger[lost]["cpu"] == [4000, 0] and ledger[drained]["cpu"] == [4000, 0]
    await assert_slots_consistent(db, agents, ids)


async def test_request_too_large_judges_every_registered_agent(db: Database) -> None:
    """Larger than any agent fails (request_too_large); fitting only a lost agent waits instead."""
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 4000}, {"cpu": 8000}])
    [big_agent] = [a for a, cap in agents.items() if cap["cpu"] == 8000]
    await update_agents(db, [big_agent], status="LOST")
    fits_lost, too_large = await add_sessions(db, owner, [(1, {"cpu": 6000}), (1, {"cpu": 9000})])

    result = await schedule_group(db, "default", LATER)

    handled = result.handler_result()
    assert handled.failures == [too_large.id] and handled.successes == []
    assert handled.notes[too_large.id].code == REQUEST_TOO_LARGE
    assert handled.notes[too_large.id].permanent
    assert handled.skipped == [fits_lost.id]
    assert handled.notes[fits_lost.id].code == NO_CAPACITY


async def test_second_pass_after_everything_is_placed_changes_nothing(db: Database) -> None:
    """Running the pass again places nothing twice and leaves ledger and history as they were."""
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 4000}, {"cpu": 4000}])
    ids = await add_session_ids(db, owner, 5, cpu_milli=2000)
    first = await schedule_group(db, "default", LATER)
    assert len(first.committed.placed) == 4
    [left_over] = set(ids) - set(first.committed.placed)
    ledger, history = await read_ledger(db), await history_rows(db, PHASE)

    second = await schedule_group(db, "default", LATER + timedelta(minutes=1))

    assert second.plan.order == [left_over]
    assert second.plan.placements == [] and second.committed.placed == []
    assert second.committed.stale == [] and second.committed.no_longer_fits == []
    assert await read_ledger(db) == ledger
    assert await history_rows(db, PHASE) == history
    found = await assert_slots_consistent(db, agents, ids)
    assert sorted(s.status for s in found).count(S.SCHEDULED) == 4


async def test_limited_pass_takes_its_window_in_the_groups_order(db: Database) -> None:
    """With a limit, a LIFO group's pass considers (and places) its newest sessions first."""
    await set_group_options(db, "default", {"sequencer": "lifo"})
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 10000}])
    ids = await add_session_ids(db, owner, 3)
    for age, sid in enumerate(ids):
        await update_sessions(db, [sid], created_at=NOW + timedelta(seconds=age))

    result = await schedule_group(db, "default", LATER, limit=1)

    assert result.committed.placed == [ids[-1]]


async def test_kernels_asking_different_amounts_are_each_placed_by_their_own_request(
    db: Database,
) -> None:
    """A session whose kernels' requests differ is read kernel by kernel, and fits as such.

    Sessions are created with one request for all kernels; this one is changed in the store
    so that kernel 1 asks six times what kernel 0 asks (and its row no longer names a request
    for all of its kernels).
    """
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    agents = await add_agents(db, [{"cpu": 7000}, {"cpu": 7000}])
    [mixed, uniform] = await add_sessions(db, owner, [(2, {"cpu": 1000}), (2, {"cpu": 1000})])
    await ask_of_kernel(db, mixed.id, 1, {"cpu": 6000})
    await update_sessions(db, [mixed.id], priority=1, kernel_slots=None)

    result = await schedule_group(db, "default", LATER)

    assert sorted(result.committed.placed) == sorted([mixed.id, uniform.id])
    found = await assert_slots_consistent(db, agents, [mixed.id, uniform.id])
    by_id = {s.id: s for s in found}
    assert [k.occupied_slots for k in by_id[mixed.id].kernels] == [{"cpu": 1000}, {"cpu": 6000}]
    assert len({k.agent_id for k in by_id[mixed.id].kernels}) == 2
    ledger = await read_ledger(db)
    assert sum(ledger[a]["cpu"][1] for a in agents) == 9000


async def test_upgrading_records_each_sessions_kernel_request_unless_they_differ(
    db: Database,
) -> None:
    """Migration 0009 gives a session the request of its kernels, or NULL where they differ."""
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 9000}, {"cpu": 9000}])
    [mixed, uniform] = await add_sessions(db, owner, [(2, {"cpu": 1000}), (2, {"cpu": 2000})])
    await ask_of_kernel(db, mixed.id, 1, {"cpu": 6000})
    await downgrade(db, "0008")
    await upgrade(db)
    async with db.read() as conn:
        rows = dict((await conn.execute(sa.select(sessions.c.id, sessions.c.kernel_slots))).all())
    assert rows == {mixed.id: None, uniform.id: {"cpu": 2000}}

    result = await schedule_group(db, "default", LATER)
    found = {s.id: s for s in await assert_slots_consistent(db, agents, [mixed.id, uniform.id])}
    assert sorted(result.committed.placed) == sorted([mixed.id, uniform.id])
    assert [k.occupied_slots for k in found[mixed.id].kernels] == [{"cpu": 1000}, {"cpu": 6000}]
