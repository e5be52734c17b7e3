"""One scheduling pass over a resource group: load the snapshot, place, commit atomically."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

from corral.domain.results import HandlerResult, ResultNote
from corral.domain.session import SessionWithKernels
from corral.scheduler.planner import place_sessions
from corral.scheduler.snapshot import load_snapshot, pages_queue
from corral.scheduler.types import GroupSnapshot, Outcome, Plan, QueuePage
from corral.store.database import Database
from corral.store.placements import (
    OnCommitted,
    PlacementOutcome,
    SessionPlacement,
    commit_placement_batches,
    commit_placements,
)
from corral.store.scheduling import QueuePlace

CHANGED_UNDER_US = "agent_changed"

# A pass over at least OVERLAP_FROM_SESSIONS candidates with OVERLAP_FROM_KERNELS_PER_SESSION
# kernels each on average places in a worker thread while the placements already made are
# written (one transaction), in batches of OVERLAP_FIRST_BATCH sessions, then twice as many
# each time: the writing starts early, and costs few statements in all. Any other pass places,
# then commits. Measured on 10,000 sessions and 1,000 agents (sessions/s, sequential against
# overlapped): four kernels each, SQLite 10,786-11,100 against 12,880-12,947 and PostgreSQL
# 9,583-9,699 against 11,351-11,519; one kernel each, SQLite 16,923-17,799 against
# 14,921-15,178 and PostgreSQL 15,479-15,722 against 12,835-12,944. With one kernel a session
# the commit has too little to do to hide the planner's slowdown: both threads take turns on
# the interpreter lock, and the planner takes 70 % longer.
OVERLAP_FROM_SESSIONS = 2000
OVERLAP_FROM_KERNELS_PER_SESSION = 2
OVERLAP_FIRST_BATCH = 500


@dataclass(slots=True)
class PassResult:
    """What one pass decided and what its commit actually did, with timings."""

    plan: Plan
    committed: PlacementOutcome
    load_ms: float
    # From the end of the load to the end of placement (in an overlapped pass the commit runs
    # meanwhile), then from there to the end of the commit.
    placement_ms: float
    commit_ms: float
    # A pass over a page of the queue (`schedule_group`'s `page`): the sessions it read, and
    # the page to read next, None when the queue ended or a session blocked the rest of it.
    considered: list[SessionWithKernels] = field(default_factory=list)
    next_page: QueuePage | None = None

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
    page: QueuePage | None = None,
    on_committed: OnCommitted | None = None,
) -> PassResult:
    """Place what fits in `group` now and commit it; sessions that lost a race stay PENDING.

    `limit` or `page`: the part of the queue to read (see `load_snapshot`). `on_committed` runs
    inside the commit's transaction with the sessions placed.
    """
    started = time.perf_counter()
    snapshot = await load_snapshot(db, group, now, limit=limit, page=page)
    loaded = time.perf_counter()
    if not _worth_overlapping(snapshot):
        plan = place_sessions(snapshot)
        planned = time.perf_counter()
        committed = await commit_placements(db, plan.placements, now, on_committed=on_committed)
    else:
        plan, planned, committed = await _place_while_committing(db, snapshot, now, on_committed)
    done = time.perf_counter()
    return PassResult(
        plan=plan,
        committed=committed,
        load_ms=(loaded - started) * 1000,
        placement_ms=(planned - loaded) * 1000,
        commit_ms=(done - planned) * 1000,
        considered=snapshot.read,
        next_page=_next_page(page, snapshot, plan),
    )


def _next_page(page: QueuePage | None, snapshot: GroupSnapshot, plan: Plan) -> QueuePage | None:
    """The page after `page`, if the queue may go on and no session blocked what follows."""
    if page is None or not pages_queue(snapshot.options) or not snapshot.more_queued:
        return None
    if plan.blocker is not None or not plan.order:
        return None
    last = plan.order[-1]
    by_eviction = snapshot.options.wait_for_kernels_ready.requeues_by_eviction
    session = next(s for s in snapshot.read if s.id == last)
    return QueuePage(
        page.size, QueuePlace.of(session, by_eviction=by_eviction), number=page.number + 1
    )


def _worth_overlapping(snapshot: GroupSnapshot) -> bool:
    """Whether the commit will have enough to do to be written while the planner runs."""
    sessions = len(snapshot.pending)
    if sessions < OVERLAP_FROM_SESSIONS:
        return False
    kernels = sum(s.cluster_size for s in snapshot.pending)
    return kernels >= OVERLAP_FROM_KERNELS_PER_SESSION * sessions


async def _place_while_committing(
    db: Database, snapshot: GroupSnapshot, now: datetime, on_committed: OnCommitted | None
) -> tuple[Plan, float, PlacementOutcome]:
    """Place in a worker thread while the commit writes each batch as it comes; one transaction.

    The planner is Python; the commit mostly waits, for PostgreSQL's server process or for
    SQLite's C code (which lets go of the interpreter lock while it runs a statement), so the
    two overlap on two cores instead of taking turns. Returns the plan, when it was done
    (`perf_counter`), and what the commit did.

    On SQLite the commit's first reads (the locked sessions, thousands of rows) finish before
    the planner starts: SQLite lets go of the interpreter lock for every row it steps through,
    and getting it back from a busy planner thread each time stalled those reads until the
    plan was done (the pass was 10 % slower than not overlapping at all).

    The commit is written to the end only if the planner finishes: if it raises (or this is
    cancelled), the transaction is rolled back.
    """
    loop = asyncio.get_running_loop()
    batches: asyncio.Queue[list[SessionPlacement] | None] = asyncio.Queue()

    def hand_over(batch: list[SessionPlacement]) -> None:  # in the planner's thread
        loop.call_soon_threadsafe(batches.put_nowait, batch)

    async def arriving() -> AsyncIterator[list[SessionPlacement]]:
        while (batch := await batches.get()) is not None:
            yield batch

    def plan_all() -> tuple[Plan, float]:
        plan = place_sessions(snapshot, on_batch=hand_over, first_batch=OVERLAP_FIRST_BATCH)
        return plan, time.perf_counter()

    locked = asyncio.Event()
    committing = asyncio.create_task(
        commit_placement_batches(
            db,
            arriving(),
            now,
            agent_ids=snapshot.agents.ids,
            session_ids=[s.id for s in snapshot.pending],
            on_locked=locked.set,
            on_committed=on_committed,
        ),
        name=f"commit-placements:{snapshot.group}",
    )
    try:
        if db.dialect == "sqlite":
            await _until_set_or_done(locked, committing)
        plan, planned = await asyncio.to_thread(plan_all)
    except BaseException:
        committing.cancel()
        await asyncio.gather(committing, return_exceptions=True)
        raise
    batches.put_nowait(None)
    return plan, planned, await committing


async def _until_set_or_done(event: asyncio.Event, task: asyncio.Task[object]) -> None:
    """Wait until `event` is set or `task` has ended (whichever comes first)."""
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([waiting, task], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
