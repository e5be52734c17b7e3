"""Due times of the lifecycle tasks: when a task next has work that no hint announces.

A session that waits for nothing but the clock (a phase timeout, a start time, a requeue
backoff) sets no hint when its time comes. After each lifecycle run the coordinator asks when
the task's next such moment is, and the run reports it (`TaskRun.due_in_s`); the dual loop
sleeps until then at the latest, so the work is done within moments of its due time instead of
at the next long loop (an 8 s pending timeout used to fire after 49-55 s).

The question costs a query, so it is asked at most once a `DUE_RECHECK_S` per task; a run in
between reports the answer it has, or a wake-up at the end of that second, so that a session
that entered meanwhile is looked at then. A task with no timeout and nothing of its own to
report (`LifecycleHandler.reports_due_times`) reports nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.coordination.judge import PhaseLimits
from corral.handlers.base import LifecycleHandler
from corral.store.database import Database
from corral.store.due_times import next_phase_expiry

# How often a task's next due time is read at most (and so how late a session that entered
# after the last read can be noticed).
DUE_RECHECK_S = 1.0
# Woken this much after the due time: a phase expires once its time is *exceeded*.
DUE_SLACK_S = 0.01

GroupLimits = tuple[dict[str, PhaseLimits], PhaseLimits]


class DueTimes:
    """Per task, its next due time, read at most once a `DUE_RECHECK_S`."""

    def __init__(
        self,
        db: Database,
        group_limits: Callable[[AsyncConnection, str], Awaitable[GroupLimits]],
    ) -> None:
        self._db = db
        self._group_limits = group_limits
        # Per task: when its due time was read, that due time, whether it can have one at all.
        self._read: dict[str, tuple[datetime, datetime | None, bool]] = {}

    async def due_in_s(self, handler: LifecycleHandler, now: datetime) -> float | None:
        """Seconds from `now` until `handler` next has work no hint announces (None: none)."""
        name = handler.name()
        read = self._read.get(name)
        if read is not None:
            read_at, due, timed = read
            age_s = (now - read_at) / timedelta(seconds=1)
            if 0 <= age_s < DUE_RECHECK_S and (due is None or due > now):
                if not timed:
                    return None
                recheck_s = DUE_RECHECK_S - age_s
                return recheck_s if due is None else min(recheck_s, _seconds(due, now))
        async with self._db.read_statements() as conn:
            due, timed = await self._next_due(conn, handler, now)
        self._read[name] = (now, due, timed)
        return None if due is None else _seconds(due, now)

    async def _next_due(
        self, conn: AsyncConnection, handler: LifecycleHandler, now: datetime
    ) -> tuple[datetime | None, bool]:
        """The next due time (None: none now), and whether the task can have one at all."""
        by_group, default = await self._group_limits(conn, handler.name())
        timeouts = {
            group: limits.timeout_s
            for group, limits in by_group.items()
            if limits.timeout_s is not None
        }
        timed = bool(timeouts) or default.timeout_s is not None or handler.reports_due_times
        due: list[datetime] = []
        if timeouts or default.timeout_s is not None:
            expiry = await next_phase_expiry(
                conn, handler.target_session_statuses, timeouts, default.timeout_s, now
            )
            if expiry is not None:
                due.append(expiry)
        if handler.reports_due_times:
            own = await handler.next_due(conn, now)
            if own is not None:
                due.append(own)
        return min(due, default=None), timed


def _seconds(due: datetime, now: datetime) -> float:
    """Seconds until just past `due` (a due time already past is due now)."""
    return max((due - now) / timedelta(seconds=1), 0.0) + DUE_SLACK_S
