"""SessionRepository on both backends: loading, kernel matching, guarded changes, history."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from corral.domain.lifecycle import IllegalTransitionError
from corral.domain.results import KernelMatchType, ResultNote, SchedulingResult, TransitionStatus
from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId
from corral.store.agents import NewAgent, insert_agents, read_ledger
from corral.store.database import Database
from corral.store.history import SHARED_NOTE_MIN
from corral.store.placements import commit_placements
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from corral.store.tables import kernel_history, kernels, resource_groups, session_history, sessions
from tests.integration.store._factories import (
    NOW,
    RELEASE,
    add_agents,
    add_session_ids,
    add_sessions,
    add_user,
    on,
    place_all,
    placement,
    update_agents,
    update_sessions,
)

S, K, R = SessionStatus, KernelStatus, SchedulingResult


async def history(
    db: Database, sid: SessionId
) -> list[tuple[str, str, str | None, str | None, int]]:
    """(phase, result, from, to, attempts) of each history row of the session, oldest first."""
    h = session_history.c
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(h.phase, h.result, h.from_status, h.to_status, h.attempts)
            .where(h.session_id == sid)
            .order_by(h.id)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


async def test_insert_creates_pending_sessions_with_their_kernels(db: Database) -> None:
    """A new session and its cluster_size kernels are all PENDING, kernels indexed from 0."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1, cluster_size=3)
    [loaded] = await repo.get([sid])
    assert loaded.status is S.PENDING
    assert [k.cluster_index for k in loaded.kernels] == [0, 1, 2]
    assert [k.cluster_role for k in loaded.kernels] == ["main", "sub", "sub"]
    assert all(k.status is K.PENDING and k.agent_id is None for k in loaded.kernels)
    assert loaded.requested_total() == {"cpu": 3000}


async def test_load_returns_every_column_with_its_python_type(db: Database) -> None:
    """Ids as UUIDs, timestamps as aware UTC datetimes, flags as bools, statuses as enums."""
    owner = await add_user(db)
    sid, other = await add_session_ids(db, owner, 2, cluster_size=2)
    later = NOW + timedelta(hours=1, microseconds=123456)
    await update_sessions(
        db,
        [sid],
        status=S.PREPARING.value,
        status_info="preparing",
        status_changed_at=later,
        starts_at=later + timedelta(seconds=1),
        requeue_at=later + timedelta(seconds=2),
        requeue_active=False,
        phase="PrepareSessions",
        phase_attempts=3,
        failed_agents=["a1", "a2"],
        creation_id="c-1",
        started_at=later + timedelta(seconds=3),
    )
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update()
            .where(kernels.c.session_id == sid, kernels.c.cluster_index == 1)
            .values(
                agent_id="a1",
                status=K.PREPARING.value,
                status_changed_at=later,
                occupied_slots={"cpu": 1000},
                exit_code=3,
                failure_cause="oom",
                desired_state=KernelIntent.RUN.value,
                desired_generation=2,
                stage_failure="image_pull_failure",
            )
        )
    by_id = {s.id: s for s in await SessionRepository(db).get([sid, other])}
    loaded, untouched = by_id[sid], by_id[other]
    assert isinstance(loaded.id, uuid.UUID) and loaded.id == sid
    assert isinstance(loaded.owner_id, uuid.UUID) and loaded.owner_id == owner
    assert (loaded.status, loaded.status_info, loaded.phase, loaded.phase_attempts) == (
        S.PREPARING,
        "preparing",
        "PrepareSessions",
        3,
    )
    times = (loaded.status_changed_at, loaded.starts_at, loaded.requeue_at, loaded.started_at)
    assert times == tuple(later + timedelta(seconds=n) for n in range(4))
    assert all(t is not None and t.tzinfo is UTC for t in (*times, loaded.created_at))
    assert loaded.created_at == NOW
    assert loaded.requeue_active is False and untouched.requeue_active is True
    assert (loaded.failed_agents, loaded.creation_id) == (("a1", "a2"), "c-1")
    assert (untouched.starts_at, untouched.requeue_at, untouched.started_at) == (None,) * 3
    first, second = loaded.kernels
    assert all(isinstance(k.id, uuid.UUID) and k.session_id == sid for k in loaded.kernels)
    assert first.status is K.PENDING and first.status_changed_at == NOW
    assert first.status_changed_at.tzinfo is UTC
    assert (first.agent_id, first.occupied_slots, first.desired_state) == (None, None, None)
    assert second == dataclasses.replace(
        first,
        id=second.id,
        cluster_role="sub",
        cluster_index=1,
        agent_id="a1",
        status=K.PREPARING,
        status_changed_at=later,
        occupied_slots={"cpu": 1000},
        exit_code=3,
        failure_cause="oom",
        desired_state=KernelIntent.RUN,
        desired_generation=2,
        stage_failure="image_pull_failure",
    )
    assert second.status_changed_at.tzinfo is UTC


async def test_load_filters_by_status_kernel_status_and_group(db: Database) -> None:
    """load() returns only sessions in the statuses, group and kernel statuses asked for."""
    repo = SessionRepository(db)
    owner = await add_user(db)
    async with db.transaction() as conn:
        await conn.execute(
            resource_groups.insert(), [{"name": "gpu", "options": {}, "created_at": NOW}]
        )
    default_ids = await add_session_ids(db, owner, 3)
    gpu_ids = await add_session_ids(db, owner, 2, group="gpu")
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 8000})], NOW)
    await place_all(db, default_ids[:1], AgentId("a1"))

    pending = {s.id for s in await repo.load([S.PENDING])}
    assert pending == set(default_ids[1:] + gpu_ids)
    assert {s.id for s in await repo.load([S.PENDING], resource_group="gpu")} == set(gpu_ids)
    scheduled = await repo.load([S.SCHEDULED, S.PENDING], kernel_statuses=[K.SCHEDULED])
    assert [s.id for s in scheduled] == default_ids[:1]
    assert len(await repo.load([S.PENDING], limit=2)) == 2


async def test_kernel_match_all_any_not_any(db: Database) -> None:
    """ALL, ANY and NOT_ANY answer as spec document 1 defines them over a batch of sessions."""
    repo = SessionRepository(db)
    owner = await add_user(db)
    mixed, all_pending = await add_session_ids(db, owner, 2, cluster_size=2)
    [first, _second] = (await repo.get([mixed]))[0].kernels
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update().where(kernels.c.id == first.id).values(status=K.CANCELLED.value)
        )
    pending = [S.PENDING]
    terminal = [K.TERMINATED, K.CANCELLED, K.ERROR]
    assert await repo.promotable(pending, terminal, KernelMatchType.ANY) == {mixed}
    assert await repo.promotable(pending, terminal, KernelMatchType.NOT_ANY) == {all_pending}
    assert await repo.promotable(pending, [K.PENDING], KernelMatchType.ALL) == {all_pending}
    # Only sessions in the given statuses are candidates.
    assert await repo.promotable([S.RUNNING], [K.PENDING], KernelMatchType.ALL) == set()


async def test_guarded_change_moves_only_sessions_in_the_expected_status(db: Database) -> None:
    """Sessions not in the expected status are reported stale and left exactly as they were."""
    repo = SessionRepository(db)
    owner = await add_user(db)
    a, b = await add_session_ids(db, owner, 2)
    cancel = StatusChange(
        [a], "cancel", R.SUCCESS, frozenset({S.PENDING}), TransitionStatus(S.CANCELLED, K.CANCELLED)
    )
    first = await repo.apply([cancel], NOW)
    assert first.moved() == {a: (S.PENDING, S.CANCELLED)}
    assert first.owners == {a: owner}, "the lock reports the owner of every session it passed"
    again = await repo.apply([cancel], NOW + timedelta(seconds=1))
    assert again.sessions == {} and again.stale == {a}
    loaded = {s.id: s for s in await repo.get([a, b])}
    assert loaded[a].status is S.CANCELLED
    assert all(k.status is K.CANCELLED for k in loaded[a].kernels)
    assert loaded[b].status is S.PENDING
    assert await history(db, a) == [("cancel", "SUCCESS", "PENDING", "CANCELLED", 1)]


async def test_illegal_transition_raises_before_anything_is_written(db: Database) -> None:
    """A change the session table forbids fails validation; no other change in the batch lands."""
    repo = SessionRepository(db)
    a, b = await add_session_ids(db, await add_user(db), 2)
    legal = StatusChange(
        [a], "cancel", R.SUCCESS, frozenset({S.PENDING}), TransitionStatus(S.CANCELLED)
    )
    illegal = StatusChange(
        [b], "bogus", R.SUCCESS, frozenset({S.PENDING}), TransitionStatus(S.RUNNING)
    )
    with pytest.raises(IllegalTransitionError, match="PENDING → RUNNING"):
        await repo.apply([legal, illegal], NOW)
    assert {s.status for s in await repo.get([a, b])} == {S.PENDING}
    assert await history(db, a) == []


async def test_kernels_only_move_along_their_own_table(db: Database) -> None:
    """A kernel that already ended keeps its status when its session's others are terminated."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1, cluster_size=2)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 8000})], NOW)
    await place_all(db, [sid], AgentId("a1"))
    [done, _] = (await repo.get([sid]))[0].kernels
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update().where(kernels.c.id == done.id).values(status=K.ERROR.value)
        )
    await repo.apply(
        [
            StatusChange(
                [sid],
                "terminate",
                R.SUCCESS,
                frozenset({S.SCHEDULED}),
                TransitionStatus(S.TERMINATING),
            ),
            StatusChange(
                [sid],
                "TerminateSessions",
                R.SUCCESS,
                frozenset({S.TERMINATING}),
                TransitionStatus(S.TERMINATED, K.TERMINATED),
            ),
        ],
        NOW,
    )
    [session] = await repo.get([sid])
    assert session.status is S.TERMINATED
    assert [k.status for k in session.kernels] == [K.ERROR, K.TERMINATED]


async def test_history_merges_repeated_results_and_counts_phase_attempts(db: Database) -> None:
    """Repeated NEED_RETRY in one phase is one history row; attempts count, reset on a move."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 8000})], NOW)
    await place_all(db, [sid], AgentId("a1"))
    retry = StatusChange(
        [sid],
        "PrepareSessions",
        R.NEED_RETRY,
        frozenset({S.SCHEDULED}),
        notes={sid: ResultNote("agent_unreachable", "agent a1 did not answer")},
        count_attempt=True,
    )
    for step in range(3):
        await repo.apply([retry], NOW + timedelta(seconds=step))
    [session] = await repo.get([sid])
    assert (session.phase, session.phase_attempts) == ("PrepareSessions", 3)
    assert session.status_info == "agent a1 did not answer"
    await repo.apply(
        [
            StatusChange(
                [sid],
                "PrepareSessions",
                R.SUCCESS,
                frozenset({S.SCHEDULED}),
                TransitionStatus(S.PREPARING, K.PREPARING),
            )
        ],
        NOW + timedelta(seconds=5),
    )
    [session] = await repo.get([sid])
    assert (session.phase, session.phase_attempts) == (None, 0)
    assert await history(db, sid) == [
        ("ScheduleNewSessions", "SUCCESS", "PENDING", "SCHEDULED", 1),
        ("PrepareSessions", "NEED_RETRY", "SCHEDULED", "SCHEDULED", 3),
        ("PrepareSessions", "SUCCESS", "SCHEDULED", "PREPARING", 1),
    ]
    async with db.read() as conn:
        kernel_rows = (
            await conn.execute(
                sa.select(kernel_history.c.from_status, kernel_history.c.to_status)
                .where(kernel_history.c.session_id == sid)
                .order_by(kernel_history.c.id)
            )
        ).all()
    assert [tuple(r) for r in kernel_rows] == [("PENDING", "SCHEDULED"), ("SCHEDULED", "PREPARING")]


async def _notes(db: Database, sids: list[SessionId]) -> dict[SessionId, tuple[object, ...]]:
    """Per session: its status_info and failure cause, and its newest history row's note."""
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(
                sessions.c.id,
                sessions.c.status_info,
                sessions.c.failure_cause,
                session_history.c.error_code,
                session_history.c.message,
                session_history.c.attempts,
            )
            .join(session_history, session_history.c.session_id == sessions.c.id)
            .where(sessions.c.id.in_(sids))
            .order_by(session_history.c.id)
        )
        return {SessionId(r[0]): tuple(r[1:]) for r in rows}  # the newest row wins


async def test_a_note_shared_by_many_sessions_lands_on_each_of_them(db: Database) -> None:
    """A pass noting thousands of sessions alike writes the note set-based: every session and
    its newest history row carry it, a session with its own note keeps its own, a changed note
    replaces the old one, and an ending records the note's code as the failure cause."""
    many = SHARED_NOTE_MIN + 2
    sids = await add_session_ids(db, await add_user(db), many + 1)
    crowd, loner = sids[:many], sids[many]
    repo = SessionRepository(db)
    full = ResultNote("no_capacity", "no agent has room")
    own = ResultNote("too_big", "needs 9 GPUs")

    def waiting(note_of: dict[SessionId, ResultNote]) -> StatusChange:
        return StatusChange(
            sids, "ScheduleNewSessions", R.SKIPPED, frozenset({S.PENDING}), notes=note_of
        )

    for _pass in range(2):
        await repo.apply([waiting({**dict.fromkeys(crowd, full), loner: own})], NOW)
    noted = await _notes(db, sids)
    assert {noted[sid] for sid in crowd} == {
        ("no agent has room", None, "no_capacity", "no agent has room", 2)
    }
    assert noted[loner] == ("needs 9 GPUs", None, "too_big", "needs 9 GPUs", 2)

    changed = ResultNote("no_capacity", "no agent has 1 cpu free")
    await repo.apply([waiting(dict.fromkeys(sids, changed))], NOW)
    assert set((await _notes(db, sids)).values()) == {
        ("no agent has 1 cpu free", None, "no_capacity", "no agent has 1 cpu free", 3)
    }

    gone = ResultNote("dependency_failed", "a dependency failed", permanent=True)
    await repo.apply(
        [
            StatusChange(
                sids,
                "ScheduleNewSessions",
                R.GIVE_UP,
                frozenset({S.PENDING}),
                TransitionStatus(S.CANCELLED, K.CANCELLED),
                notes=dict.fromkeys(sids, gone),
            )
        ],
        NOW,
    )
    assert {v[:4] for v in (await _notes(db, sids)).values()} == {
        ("a dependency failed", "dependency_failed", "dependency_failed", "a dependency failed")
    }


async def test_back_to_pending_releases_slots_and_remembers_the_failed_agent(db: Database) -> None:
    """GIVE_UP back to PENDING frees the agent's slots, clears placement, records the agent."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1, cluster_size=2, cpu_milli=1500)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 4000})], NOW)
    await place_all(db, [sid], AgentId("a1"))
    assert (await read_ledger(db))["a1"]["cpu"] == [4000, 3000]
    applied = await repo.apply(
        [
            StatusChange(
                [sid],
                "PrepareSessions",
                R.GIVE_UP,
                frozenset({S.SCHEDULED, S.PREPARING}),
                TransitionStatus(S.PENDING, K.PENDING),
            )
        ],
        NOW,
    )
    assert applied.moved() == {sid: (S.SCHEDULED, S.PENDING)}
    assert (await read_ledger(db))["a1"]["cpu"] == [4000, 0]
    [session] = await repo.get([sid])
    assert session.failed_agents == ("a1",)
    assert all(k.agent_id is None and k.occupied_slots is None for k in session.kernels)


async def test_terminal_kernels_release_slots_once(db: Database) -> None:
    """Terminating frees the slots; a second terminate finds nothing to release."""
    repo = SessionRepository(db)
    [sid] = await add_session_ids(db, await add_user(db), 1, cpu_milli=2000)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 4000})], NOW)
    await place_all(db, [sid], AgentId("a1"))
    finish = [
        StatusChange(
            [sid], "terminate", R.SUCCESS, frozenset({S.SCHEDULED}), TransitionStatus(S.TERMINATING)
        ),
        StatusChange(
            [sid],
            "TerminateSessions",
            R.SUCCESS,
            frozenset({S.TERMINATING}),
            TransitionStatus(S.TERMINATED, K.TERMINATED),
        ),
    ]
    await repo.apply(finish, NOW)
    await repo.apply(finish, NOW)
    assert (await read_ledger(db))["a1"]["cpu"] == [4000, 0]
    [session] = await repo.get([sid])
    assert session.kernels[0].agent_id == "a1"  # kept for logs and history
    assert session.kernels[0].occupied_slots is None


# Regression: found while writing the store properties (test_store_properties.py), now fixed.
async def test_a_released_kernel_has_sql_null_occupied_slots(db: Database) -> None:
    """After giving its slots back, a kernel's occupied_slots IS NULL again, as before placement."""
    agents = await add_agents(db, [{"cpu": 4000}])
    (session,) = await add_sessions(db, await add_user(db), [(1, {"cpu": 1000})])
    await commit_placements(db, [placement(session, sorted(agents))], NOW)
    await SessionRepository(db).apply([on(RELEASE, [session.id])], NOW)
    async with db.read() as conn:
        holders = await conn.scalar(
            sa.select(sa.func.count()).where(
                kernels.c.session_id == session.id, kernels.c.occupied_slots.is_not(None)
            )
        )
    assert holders == 0


async def test_watched_sessions_are_loaded_only_when_they_need_attention(db: Database) -> None:
    """SCHEDULED always; PREPARING only with a live kernel's stage failure, a live kernel on
    an agent that is not ALIVE, or entered before `expiring_before`."""
    repo = SessionRepository(db)
    owner = await add_user(db)
    await insert_agents(
        db, [NewAgent(AgentId(a), a, {"cpu": 64000}) for a in ("alive", "lost")], NOW
    )
    ids = await add_session_ids(db, owner, 7)
    scheduled, quiet, failed, failed_ended, on_lost, old, ended_on_lost = ids
    await place_all(db, [scheduled, quiet, failed, failed_ended, old], AgentId("alive"))
    await place_all(db, [on_lost, ended_on_lost], AgentId("lost"))
    preparing = [quiet, failed, failed_ended, on_lost, old, ended_on_lost]
    await update_sessions(db, preparing, status=S.PREPARING.value)
    await update_sessions(db, [old], status_changed_at=NOW - timedelta(hours=1))
    await update_agents(db, [AgentId("lost")], status="LOST")
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update()
            .where(kernels.c.session_id.in_([failed, failed_ended]))
            .values(stage_failure="image_pull_failure")
        )
        await conn.execute(
            kernels.update()
            .where(kernels.c.session_id.in_([failed_ended, ended_on_lost]))
            .values(status=K.ERROR.value)
        )

    async def needing(expiring_before: datetime | None) -> set[SessionId]:
        found = await repo.load_needing_attention(
            [S.SCHEDULED, S.PREPARING], [S.PREPARING], expiring_before
        )
        return {s.id for s in found}

    assert await needing(None) == {scheduled, failed, on_lost}
    assert await needing(NOW - timedelta(minutes=30)) == {scheduled, failed, on_lost, old}
    # Every watched session entered its status before this instant: all of them are due.
    assert await needing(NOW + timedelta(seconds=1)) == {scheduled, *preparing}
    found = await repo.load_needing_attention([S.SCHEDULED, S.PREPARING], [S.PREPARING], None)
    [loaded] = [s for s in found if s.id == failed]
    assert [k.stage_failure for k in loaded.kernels] == ["image_pull_failure"]
