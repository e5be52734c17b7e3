"""One scheduling pass over a resource group: load the snapshot, place, commit atomically."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from corral.domain.results import HandlerResult, ResultNote
from corral.domain.session import SessionWithKernels
from corral.scheduler.planner import place_sessions
from corral.scheduler.snapshot import load_snapshot
from corral.scheduler.types import Outcome, Plan
from corral.store.database import Database
from corral.store.placements import OnCommitted, PlacementOutcome, commit_placements

CHANGED_UNDER_US = "agent_changed"


@dataclass(slots=True)
class PassResult:
    """What one pass decided and what its commit actually did, with timings."""

    plan: Plan
    committed: PlacementOutcome
    load_ms: float
    placement_ms: float
    commit_ms: float

    def handler_result(self) -> HandlerResult:
        """The pass in the shape the coordinator judges: successes, failures, skipped, notes."""
        result = HandlerResult()
        result.successes.extend(self.committed.placed)
        for sid in self.committed.no_longer_fits:
            result.skipped.append(sid)
            result.notes[sid] = ResultNote(
                CHANGED_UNDER_US,
                "an agent's free capacity changed while this session was being placed; "
                "it will be placed on the next pass",
            )
        for sid, decision in self.plan.decisions.items():
            if decision.outcome is Outcome.PLACED:
                continue
            note = ResultNote(
                decision.code, decision.message, permanent=decision.outcome is Outcome.FAILED
            )
            result.notes[sid] = note
            if decision.outcome is Outcome.FAILED:
                result.failures.append(sid)
            else:
                result.skipped.append(sid)
        return result


async def schedule_group(
    db: Database,
    group: str,
    now: datetime,
    *,
    limit: int | None = None,
    pending: Sequence[SessionWithKernels] | None = None,
    on_committed: OnCommitted | None = None,
) -> PassResult:
    """Place what fits in `group` now and commit it; sessions that lost a race stay PENDING.

    `pending`: the group's PENDING sessions, already loaded (see `load_snapshot`).
    `on_committed` runs inside the commit's transaction with the sessions placed.
    """
    started = time.perf_counter()
    snapshot = await load_snapshot(db, group, now, limit=limit, pending=pending)
    loaded = time.perf_counter()
    plan = place_sessions(snapshot)
    planned = time.perf_counter()
    committed = await commit_placements(db, plan.placements, now, on_committed=on_committed)
    done = time.perf_counter()
    return PassResult(
        plan=plan,
        committed=committed,
        load_ms=(loaded - started) * 1000,
        placement_ms=(planned - loaded) * 1000,
        commit_ms=(done - planned) * 1000,
    )
