"""EnforceTimeLimits: a RUNNING session past its wall-time limit is stopped, result timeout.

Not a lifecycle handler over a status (every RUNNING session would be its target): its targets
are the sessions whose deadline has come, read through the deadlines' index. It moves them to
TERMINATING with the cause `time_limit` recorded at once, so TerminateSessions stops their
kernels and PromoteToTerminated ends them TERMINATED with result timeout
(`outcome.REQUESTED_RESULTS`); their slots are released as for any end. It also says when the
next deadline comes, so the task's loop wakes then rather than at its long interval.
"""

from __future__ import annotations

from datetime import datetime

from corral.domain.outcome import TIME_LIMIT
from corral.domain.record import record
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.status import SessionStatus
from corral.domain.time_limit import format_duration
from corral.store.database import Database
from corral.store.status_changes import StatusChange
from corral.store.time_limits import read_due, read_next_deadline

# Sessions stopped per run; a run that fills it is due again at once.
BATCH = 1000


@record
class DueLimits:
    """What one look at the deadlines found: the move to make, and the next deadline."""

    change: StatusChange | None
    full: bool  # the batch was full: more may be due now
    next_deadline: datetime | None


class EnforceTimeLimits:
    """Finds the running sessions past their deadline and the next deadline to come."""

    def __init__(self, db: Database, batch: int = BATCH) -> None:
        self.db = db
        self.batch = batch

    @classmethod
    def name(cls) -> str:
        return "EnforceTimeLimits"

    async def due(self, now: datetime) -> DueLimits:
        """The guarded move RUNNING → TERMINATING of every session due at `now`."""
        async with self.db.read_statements() as conn:
            due = await read_due(conn, now, self.batch)
            next_deadline = await read_next_deadline(conn, now)
        if not due:
            return DueLimits(None, False, next_deadline)
        notes = {
            sid: ResultNote(TIME_LIMIT, f"ran past its time limit of {format_duration(limit)}")
            for sid, limit in due
        }
        change = StatusChange(
            [sid for sid, _ in due],
            self.name(),
            SchedulingResult.SUCCESS,
            frozenset({SessionStatus.RUNNING}),
            TransitionStatus(SessionStatus.TERMINATING),
            notes=notes,
            records_cause=True,
        )
        return DueLimits(change, len(due) >= self.batch, next_deadline)
