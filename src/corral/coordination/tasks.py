"""A coordinator task: one handler run, woken by one hint, guarded by one lock.

The loops (`loop.py`) know nothing of sessions or handlers: they drive `Task`s. A coordinator
builds one task per handler; its `run` does lock-free work only, the loop takes the lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from corral.domain.record import record


@record
class TaskRun:
    """What one run of a task did, for logs, metrics and the loop's follow-up decision."""

    task: str
    targets: int = 0  # sessions (or entities) the run looked at
    changed: int = 0  # entities whose status changed
    duration_ms: float = 0.0
    # Seconds from the end of this run until the task next has work that no hint will announce
    # (a phase timeout, a start time, a deadline); the loop wakes then. None: nothing is due.
    due_in_s: float | None = None


@record
class Task:
    """One unit a dual loop drives: `run` it when `hint` is set, and every long interval."""

    name: str  # stable: the metric label, the log field, part of the lock name
    hint: str  # the hint that wakes this task early
    run: Callable[[], Awaitable[TaskRun]]
    lock: str | None = None  # the lock held during a run (None: runs without one)
    # A quick task (a promotion: a few statements, reacting to agents' reports) waits a shorter
    # burst debounce (`LoopIntervals.quick_debounce_s`): batching saves it little.
    quick: bool = False
    # A patient task (its work waits for nothing urgent: a retry's delay is seconds) gathers a
    # burst this long instead of the loop's debounce, so it runs, and commits, far less often.
    batch_s: float | None = None
