"""ScheduleNewSessions: place PENDING sessions on agents, wrapping the scheduler."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corral.domain.results import HandlerResult, StatusTransitions, TransitionStatus
from corral.domain.session import SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import Clock
from corral.handlers.base import LifecycleHandler
from corral.scheduler.scheduler import PassResult, schedule_group
from corral.store.database import Database
from corral.store.placements import OnCommitted


class ScheduleNewSessions(LifecycleHandler):
    """PENDING → SCHEDULED: one scheduling pass per resource group with pending sessions.

    The placement commit moves the placed sessions itself (one transaction with the slots they
    occupy), so the coordinator only judges the rest: failures that no retry can fix give up at
    once (CANCELLED, with the scheduler's reason), skips are recorded, and a PENDING timeout,
    when configured, cancels what waited too long.
    """

    commits_successes = True

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        on_placed: OnCommitted | None = None,
        on_pass: Callable[[PassResult], None] | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.on_placed = on_placed
        self.on_pass = on_pass  # told about every scheduling pass (metrics)

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

    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        result = HandlerResult()
        for group in sorted({s.resource_group for s in targets}):
            # The targets are every PENDING session, just loaded: each pass picks its group's
            # candidates among them rather than reading the queue a second time.
            passed = await schedule_group(
                self.db, group, self.clock(), pending=targets, on_committed=self.on_placed
            )
            if self.on_pass is not None:
                self.on_pass(passed)
            part = passed.handler_result()
            result.successes.extend(part.successes)
            result.failures.extend(part.failures)
            result.skipped.extend(part.skipped)
            result.notes.update(part.notes)
        return result
