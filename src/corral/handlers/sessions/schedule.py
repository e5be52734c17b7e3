"""ScheduleNewSessions: place PENDING sessions on agents, wrapping the scheduler."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.coordination.quarantine import Quarantine
from corral.domain.results import HandlerResult, StatusTransitions, TransitionStatus
from corral.domain.session import SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import Clock
from corral.handlers.base import LifecycleHandler
from corral.scheduler.scheduler import PassResult, schedule_group
from corral.scheduler.types import QueuePage
from corral.store.database import Database
from corral.store.due_times import next_placeable
from corral.store.placements import OnCommitted
from corral.store.scheduling import read_pending_groups

# How many of a group's queue a pass reads at a time (see `ScheduleNewSessions`).
QUEUE_PAGE = 5_000


class ScheduleNewSessions(LifecycleHandler):
    """PENDING → SCHEDULED: one scheduling pass per resource group with pending sessions.

    The placement commit moves the placed sessions itself (one transaction with the slots they
    occupy), so the coordinator only judges the rest: failures that no retry can fix give up at
    once (CANCELLED, with the scheduler's reason), skips are recorded, and a PENDING timeout,
    when configured, cancels what waited too long.

    A pass reads each group's queue itself, `page_size` sessions at a time in queue order, and
    places each page before it reads the next: it stops at the end of the queue or at the
    first page in which a session waits for capacity under strict ordering, since every
    session after that one waits behind it. So on a full cluster a pass costs one page, not
    the whole queue; the sessions further back are judged (noted, failed) when a pass reaches
    them. A group whose order depends on the whole queue (DRF) or that lets sessions pass one
    another (best-effort ordering) is read whole.
    """

    commits_successes = True
    reads_own_targets = True
    reports_due_times = True

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        on_placed: OnCommitted | None = None,
        on_pass: Callable[[PassResult], None] | None = None,
        page_size: int = QUEUE_PAGE,
        quarantine: Quarantine | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size: must be at least 1, got {page_size}")
        self.db = db
        self.clock = clock
        self.on_placed = on_placed
        self.on_pass = on_pass  # told about every scheduling pass (metrics)
        self.page_size = page_size
        # Sessions whose stored request placement cannot work with are failed through it.
        self.quarantine = quarantine or Quarantine(db, clock=clock)

    @classmethod
    def name(cls) -> str:
        return "ScheduleNewSessions"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.PENDING})

    @property
    def target_kernel_statuses(self) -> frozenset[KernelStatus] | None:
        return frozenset({KernelStatus.PENDING})

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        cancel = TransitionStatus(SessionStatus.CANCELLED, KernelStatus.CANCELLED)
        return StatusTransitions(
            success=TransitionStatus(SessionStatus.SCHEDULED, KernelStatus.SCHEDULED),
            need_retry=None,
            expired=cancel,
            give_up=cancel,
        )

    async def next_due(self, conn: AsyncConnection, now: datetime) -> datetime | None:
        """When a PENDING session's start time or requeue backoff next ends."""
        return await next_placeable(conn, now)

    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        """Place what fits, group by group; `targets` is unused (the queue is read here)."""
        result = HandlerResult()
        now = self.clock()
        async with self.db.read_statements() as conn:
            groups = await read_pending_groups(conn)
        for group in groups:
            page: QueuePage | None = QueuePage(self.page_size)
            while page is not None:
                passed = await schedule_group(
                    self.db, group, now, page=page, on_committed=self.on_placed
                )
                if self.on_pass is not None:
                    self.on_pass(passed)
                if passed.plan.invalid:
                    # Before the next page is read: it must not meet them again.
                    await self.quarantine.isolate(
                        passed.plan.invalid, where=f"scheduling in resource group {group!r}"
                    )
                part = passed.handler_result()
                result.successes.extend(part.successes)
                result.failures.extend(part.failures)
                result.skipped.extend(part.skipped)
                result.notes.update(part.notes)
                result.considered.extend(passed.considered)
                page = passed.next_page
        return result
