"""A large pass places in a worker thread while its batches are written, in one transaction."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from corral.domain.status import SessionStatus
from corral.scheduler import scheduler
from corral.scheduler.planner import place_sessions
from corral.scheduler.scheduler import schedule_group
from corral.scheduler.types import GroupSnapshot, Outcome, Plan
from corral.store import placements
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.placements import PHASE, SessionPlacement
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_sessions,
    add_user,
    assert_kernels_follow_sessions,
    assert_slots_consistent,
    history_rows,
)

# Long enough for a batch write on a loaded machine; only a failure ever waits this long.
DEADLINE_S = 30.0


@pytest.fixture
def overlapped(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every pass overlaps, in batches of 1, 2, 4, ...; returns the sizes handed over."""
    monkeypatch.setattr(scheduler, "OVERLAP_FROM_KERNELS_PER_SESSION", 0)
    return _spy_batches(monkeypatch)


def _spy_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Passes of any size may overlap, in batches of 1, 2, 4, ...: the sizes handed over."""
    monkeypatch.setattr(scheduler, "OVERLAP_FROM_SESSIONS", 1)
    monkeypatch.setattr(scheduler, "OVERLAP_FIRST_BATCH", 1)
    sizes: list[int] = []

    def spying(snapshot: GroupSnapshot, **kwargs: Any) -> Plan:
        hand_over: Callable[[list[SessionPlacement]], None] | None = kwargs.pop("on_batch", None)
        if hand_over is None:  # not overlapped
            return place_sessions(snapshot, **kwargs)

        def counted(batch: list[SessionPlacement]) -> None:
            sizes.append(len(batch))
            hand_over(batch)

        return place_sessions(snapshot, on_batch=counted, **kwargs)

    monkeypatch.setattr(scheduler, "place_sessions", spying)
    return sizes


async def test_every_batch_of_an_overlapped_pass_is_committed(
    db: Database, overlapped: list[int]
) -> None:
    """All placements of every batch are written; what does not fit waits, all consistent."""
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 8000}, {"cpu": 8000}, {"cpu": 8000}])
    # 12 that fit (21 of the 24 cpus), then one no agent can hold
    shapes = [(1, {"cpu": 1000})] * 9 + [(2, {"cpu": 2000})] * 3 + [(1, {"cpu": 9000})]
    sessions = await add_sessions(db, owner, shapes)
    ids = [s.id for s in sessions]

    result = await schedule_group(db, "default", NOW)

    assert overlapped == [1, 2, 4, 5]  # 12 placed: 1, 2, 4, then the rest at the end
    planned = [sid for sid, d in result.plan.decisions.items() if d.outcome is Outcome.PLACED]
    assert sorted(result.committed.placed) == sorted(planned) == sorted(ids[:12])
    found = await assert_slots_consistent(db, agents, ids)
    assert_kernels_follow_sessions(found)
    status = {s.id: s.status for s in found}
    assert [status[sid] for sid in ids] == [SessionStatus.SCHEDULED] * 12 + [SessionStatus.PENDING]
    assert sum(cells["cpu"][1] for cells in (await read_ledger(db)).values()) == 21000
    assert sorted(row[0] for row in await history_rows(db, PHASE)) == sorted(ids[:12])


async def test_a_planner_failing_midway_leaves_nothing_written(
    db: Database, overlapped: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch already written when the planner fails is rolled back with the rest."""
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 8000}])
    ids = [s.id for s in await add_sessions(db, owner, [(1, {"cpu": 1000})] * 4)]
    first_written = threading.Event()
    commit_batch = placements._commit_batch

    async def noting(*args: Any, **kwargs: Any) -> None:
        await commit_batch(*args, **kwargs)
        first_written.set()

    monkeypatch.setattr(placements, "_commit_batch", noting)
    planning = scheduler.place_sessions

    def failing(snapshot: GroupSnapshot, **kwargs: Any) -> Plan:
        hand_over = kwargs.pop("on_batch")

        def then_fail(batch: list[SessionPlacement]) -> None:
            hand_over(batch)
            assert first_written.wait(DEADLINE_S), "the first batch was never written"
            raise RuntimeError("the planner broke")

        return planning(snapshot, on_batch=then_fail, **kwargs)

    monkeypatch.setattr(scheduler, "place_sessions", failing)

    with pytest.raises(RuntimeError, match="the planner broke"):
        await schedule_group(db, "default", NOW)

    assert first_written.is_set()
    found = await assert_slots_consistent(db, agents, ids)
    assert [s.status for s in found] == [SessionStatus.PENDING] * 4
    assert await history_rows(db, PHASE) == []


@pytest.mark.parametrize(("kernels", "overlaps"), [(1, False), (2, True)])
async def test_only_passes_of_multi_kernel_sessions_overlap(
    db: Database, monkeypatch: pytest.MonkeyPatch, kernels: int, overlaps: bool
) -> None:
    """With a kernel a session the commit is too short to hide the planner: no overlap."""
    handed_over = _spy_batches(monkeypatch)
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 8000}])
    ids = [s.id for s in await add_sessions(db, owner, [(kernels, {"cpu": 1000})] * 3)]

    result = await schedule_group(db, "default", NOW)

    assert sorted(result.committed.placed) == sorted(ids)
    assert handed_over == ([1, 2] if overlaps else [])
