"""Concurrent writers on PostgreSQL: no overcommit, no double placement, each move made once."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from corral.domain.session import MilliSlots, SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId
from corral.store._sql import in_values
from corral.store.database import Database
from corral.store.placements import PHASE as SCHEDULE_PHASE
from corral.store.placements import PlacementOutcome, SessionPlacement, commit_placements
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from corral.store.tables import kernel_history, session_history
from tests.integration.store._factories import (
    NOW,
    PREPARE,
    RELEASE,
    add_agents,
    add_sessions,
    add_user,
    assert_kernels_follow_sessions,
    assert_slots_consistent,
    on,
    placement,
)

S = SessionStatus
K = KernelStatus

# (phase, result, to_status) of the history rows that place a session or kernel, and release it
PLACED_ROW = [SCHEDULE_PHASE, "SUCCESS", "SCHEDULED"]
RELEASED_ROW = [RELEASE.phase, "GIVE_UP", "PENDING"]


async def busy_cluster(
    db: Database, rng: random.Random
) -> tuple[dict[AgentId, MilliSlots], list[SessionWithKernels]]:
    """20 agents and 300 sessions asking for about three times what the agents have."""
    agents = await add_agents(db, [{"cpu": 16_000, "mem": 64_000}] * 20)
    shapes = [
        (rng.randint(1, 3), {"cpu": rng.choice([500, 1000, 2000, 4000]), "mem": 4000})
        for _ in range(300)
    ]
    return agents, await add_sessions(db, await add_user(db), shapes)


def greedy_plan(
    candidates: Sequence[SessionWithKernels],
    agents: Mapping[AgentId, MilliSlots],
    rng: random.Random,
) -> list[SessionPlacement]:
    """A planner that believes every agent is empty: first fit, in a shuffled order."""
    free = {a: dict(capacity) for a, capacity in agents.items()}
    plan: list[SessionPlacement] = []
    for s in rng.sample(list(candidates), len(candidates)):
        trial = {a: dict(slots) for a, slots in free.items()}
        chosen: list[AgentId] = []
        for k in s.kernels:
            fitting = [
                a
                for a in rng.sample(sorted(trial), len(trial))
                if all(trial[a].get(n, 0) >= v for n, v in k.requested_slots.items())
            ]
            if not fitting:
                break
            chosen.append(fitting[0])
            for n, v in k.requested_slots.items():
                trial[fitting[0]][n] -= v
        else:
            free = trial
            plan.append(placement(s, chosen))
    return plan


def assert_covers(plan: Sequence[SessionPlacement], outcome: PlacementOutcome) -> None:
    """Every planned session is reported exactly once: placed, no longer fits, or stale."""
    reported = outcome.placed + outcome.no_longer_fits + outcome.stale
    assert sorted(reported) == sorted(p.session_id for p in plan)


async def placements_and_releases(
    db: Database, table: sa.Table, ids: Collection[SessionId]
) -> tuple[Counter[Any], Counter[Any]]:
    """Per session (or kernel) of `ids`: how often history shows it placed, and given back."""
    entity = table.c.session_id if table is session_history else table.c.kernel_id
    async with db.read() as conn:
        rows = (
            await conn.execute(
                sa.select(
                    entity.label("entity"),
                    table.c.phase,
                    table.c.result,
                    table.c.to_status,
                    table.c.attempts,
                ).where(in_values(db.dialect, table.c.session_id, ids))
            )
        ).all()
    assert all(r.attempts == 1 for r in rows), "a real move was folded into an earlier row"
    moves = Counter((r.entity, r.phase, r.result, r.to_status) for r in rows)
    placed = Counter({e: n for (e, *move), n in moves.items() if move == PLACED_ROW})
    released = Counter({e: n for (e, *move), n in moves.items() if move == RELEASED_ROW})
    return placed, released


async def assert_placed_once(
    db: Database, agents: Mapping[AgentId, MilliSlots], ids: Collection[SessionId]
) -> list[SessionWithKernels]:
    """Slots consistent, and each session placed once per time it was given back, no more."""
    found = await assert_slots_consistent(db, agents, ids)
    assert_kernels_follow_sessions(found)
    placed, released = await placements_and_releases(db, session_history, ids)
    for s in found:
        assert placed[s.id] == released[s.id] + (s.status is S.SCHEDULED), s.id
    placed, released = await placements_and_releases(db, kernel_history, ids)
    for k in (k for s in found for k in s.kernels):
        assert placed[k.id] == released[k.id] + (k.status is K.SCHEDULED), k.id
    return found


async def test_concurrent_planners_never_overcommit_or_place_twice(
    two_writers: tuple[Database, Database],
) -> None:
    """Two overlapping plans committed at once: no agent over capacity, no session placed twice."""
    first, second = two_writers
    rng = random.Random(7)
    agents, created = await busy_cluster(first, rng)
    ids = [s.id for s in created]
    placed: Counter[SessionId] = Counter()
    for round_ in range(3):
        now = NOW + timedelta(seconds=round_)
        pending = [s for s in await SessionRepository(first).get(ids) if s.status is S.PENDING]
        plans = [greedy_plan(pending, agents, rng) for _ in range(2)]
        if round_ == 0:
            shared = {p.session_id for p in plans[0]} & {p.session_id for p in plans[1]}
            assert len(shared) > 10, "the two plans should compete for the same sessions"
        outcomes = await asyncio.gather(
            commit_placements(first, plans[0], now), commit_placements(second, plans[1], now)
        )
        for plan, outcome in zip(plans, outcomes, strict=True):
            assert_covers(plan, outcome)
            placed.update(outcome.placed)
        await assert_placed_once(first, agents, ids)
    assert placed and max(placed.values()) == 1


async def test_release_while_placing_keeps_the_ledger_exact(
    two_writers: tuple[Database, Database],
) -> None:
    """One writer gives sessions back while the other places: slots and placements stay exact."""
    placer, releaser = two_writers
    rng = random.Random(11)
    agents, created = await busy_cluster(placer, rng)
    ids = [s.id for s in created]
    await commit_placements(placer, greedy_plan(created, agents, rng), NOW)
    for round_ in range(4):
        now = NOW + timedelta(seconds=round_ + 1)
        found = await assert_placed_once(placer, agents, ids)
        scheduled = [s for s in found if s.status is S.SCHEDULED]
        released = rng.sample(scheduled, len(scheduled) // 2)
        # The planner already counts the released sessions as pending again, and their slots
        # as free, so it races the release for both.
        candidates = [s for s in found if s.status is S.PENDING] + released
        plan = greedy_plan(candidates, agents, rng)
        applied, outcome = await asyncio.gather(
            SessionRepository(releaser).apply([on(RELEASE, [s.id for s in released])], now),
            commit_placements(placer, plan, now),
        )
        assert not applied.stale
        assert set(applied.moved()) == {s.id for s in released}
        assert_covers(plan, outcome)
    await assert_placed_once(placer, agents, ids)


@pytest.mark.parametrize("change", [RELEASE, PREPARE], ids=["release", "prepare"])
async def test_concurrent_guarded_applies_move_each_session_once(
    two_writers: tuple[Database, Database], change: StatusChange
) -> None:
    """Two writers applying one guarded change to the same sessions: each moves exactly once."""
    first, second = two_writers
    rng = random.Random(3)
    agents, created = await busy_cluster(first, rng)
    ids = [s.id for s in created]
    outcome = await commit_placements(first, greedy_plan(created, agents, rng), NOW)
    targets = outcome.placed
    chunks = [targets[i : i + 10] for i in range(0, len(targets), 10)]

    async def writer(db: Database, order: Sequence[list[SessionId]]) -> tuple[set[Any], set[Any]]:
        moved: set[SessionId] = set()
        stale: set[SessionId] = set()
        for chunk in order:
            applied = await SessionRepository(db).apply([on(change, chunk)], NOW)
            moved |= set(applied.moved())
            stale |= applied.stale
        return moved, stale

    (moved_a, stale_a), (moved_b, stale_b) = await asyncio.gather(
        writer(first, chunks), writer(second, [c[::-1] for c in reversed(chunks)])
    )
    assert moved_a.isdisjoint(moved_b)
    assert moved_a | moved_b == set(targets)
    assert stale_a == set(targets) - moved_a
    assert stale_b == set(targets) - moved_b
    assert change.target is not None and change.target.session is not None
    async with first.read() as conn:
        rows = (
            await conn.execute(
                sa.select(session_history.c.session_id, session_history.c.attempts).where(
                    in_values(first.dialect, session_history.c.session_id, ids),
                    session_history.c.phase == change.phase,
                    session_history.c.to_status == change.target.session.value,
                )
            )
        ).all()
    assert sorted(r.session_id for r in rows) == sorted(targets)
    assert all(r.attempts == 1 for r in rows)
    found = await assert_slots_consistent(first, agents, ids)
    assert all(s.status is change.target.session for s in found if s.id in moved_a | moved_b)
