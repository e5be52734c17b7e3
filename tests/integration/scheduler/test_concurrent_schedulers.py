"""Two schedulers racing over one group on PostgreSQL: exact ledger, each session placed once."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import pytest

from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.scheduler import scheduler
from corral.scheduler.scheduler import PassResult, schedule_group
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.placements import PHASE
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_sessions,
    add_user,
    assert_kernels_follow_sessions,
    assert_slots_consistent,
    history_rows,
)

S = SessionStatus
KERNEL_CPU = 1000
# Candidates each scheduler reads in the first rounds: different, overlapping windows of the
# queue, so the two plans differ yet compete for sessions and agents.
WINDOWS = [(4, 7), (6, 3), (5, 5)]
MAX_ROUNDS = 12


def assert_commit_covers_plan(result: PassResult) -> None:
    """Every planned session was placed, no longer fit, or was stale: exactly one of them."""
    planned = [p.session_id for p in result.plan.placements]
    committed = result.committed
    outcomes = [*committed.placed, *committed.no_longer_fits, *committed.stale]
    assert sorted(outcomes) == sorted(planned)


@pytest.mark.parametrize("overlapped", [False, True], ids=["sequential", "overlapped"])
async def test_concurrent_passes_never_overcommit_or_place_twice(
    two_writers: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch, overlapped: bool
) -> None:
    """Racing passes keep the ledger exact, place each session once, and fill what fits.

    Overlapped: every pass places in its thread while it commits in batches of 1, 2, 4, ...
    """
    if overlapped:
        monkeypatch.setattr(scheduler, "OVERLAP_FROM_SESSIONS", 1)
        monkeypatch.setattr(scheduler, "OVERLAP_FROM_KERNELS_PER_SESSION", 0)
        monkeypatch.setattr(scheduler, "OVERLAP_FIRST_BATCH", 1)
    first, second = two_writers
    agents = await add_agents(first, [{"cpu": 4000}] * 8)
    capacity = sum(cap["cpu"] for cap in agents.values())
    ids: list[SessionId] = []
    for _ in range(3):
        owner = await add_user(first)
        shapes = [(1 + i % 2, {"cpu": KERNEL_CPU}) for i in range(10)]
        ids += [s.id for s in await add_sessions(first, owner, shapes)]
    # 30 sessions of 45 kernels ask for more than the 32 kernels that fit
    placed: Counter[SessionId] = Counter()
    contested = 0
    for round_ in range(MAX_ROUNDS):
        now = NOW + timedelta(seconds=round_ + 1)
        limits = WINDOWS[round_] if round_ < len(WINDOWS) else (None, None)
        results = await asyncio.gather(
            schedule_group(first, "default", now, limit=limits[0]),
            schedule_group(second, "default", now, limit=limits[1]),
        )
        for result in results:
            assert_commit_covers_plan(result)
            placed.update(result.committed.placed)
            contested += len(result.committed.stale) + len(result.committed.no_longer_fits)
        await assert_slots_consistent(first, agents, ids)
        if round_ >= len(WINDOWS) and not any(r.committed.placed for r in results):
            break
    else:
        pytest.fail(f"the passes still placed sessions after {MAX_ROUNDS} rounds")

    assert contested > 0, "the two schedulers should have competed for sessions or agents"
    assert placed and max(placed.values()) == 1
    found = await assert_slots_consistent(first, agents, ids)
    assert_kernels_follow_sessions(found)
    scheduled = {s.id for s in found if s.status is S.SCHEDULED}
    assert {s.status for s in found} <= {S.SCHEDULED, S.PENDING}
    assert scheduled == set(placed)
    assert sorted(await history_rows(first, PHASE)) == sorted(
        (sid, "SUCCESS", "SCHEDULED", 1) for sid in scheduled
    )
    # Every kernel asks for one cpu and a session for at most two: once the passes settle,
    # less than one session's worth is left free, or the head of the queue would fit.
    ledger = await read_ledger(first)
    free = capacity - sum(ledger[a]["cpu"][1] for a in agents)
    assert free < 2 * KERNEL_CPU
    held = sum(len(s.kernels) for s in found if s.id in scheduled) * KERNEL_CPU
    assert held == capacity - free
    settled = await schedule_group(first, "default", NOW + timedelta(hours=1))
    assert settled.plan.placements == []
