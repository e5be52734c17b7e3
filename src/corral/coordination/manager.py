"""Assembling a manager's coordination: the session coordinator's tasks, a dual loop each."""

from __future__ import annotations

from collections.abc import Sequence

from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.loop import DualLoop
from corral.coordination.orchestrator import Orchestrator
from corral.coordination.tasks import Task
from corral.domain.record import record
from corral.infra.hints import HintBus
from corral.infra.locks import LockManager


@record
class LoopIntervals:
    """How often the loops run: hinted (short), always (long), the burst debounce (of quick
    tasks, the promotions, and of the others), and how long a task's lock is kept for the next
    hint after a run.

    A busy lifecycle task (placement, acting on agents) waits 5 ms for a burst to gather; a
    promotion, a few statements, only 1 ms: at 100 submissions/s on PostgreSQL the two
    promotions' 5 ms had been 10 of a session's 45 ms to RUNNING, and a shorter wait for the
    lifecycle tasks cost more in extra runs than it saved.
    """

    short_interval_s: float = 2.0
    long_interval_s: float = 60.0
    debounce_s: float = 0.005
    quick_debounce_s: float = 0.001
    lock_linger_s: float = 1.0


def task_loops(
    tasks: Sequence[Task],
    hints: HintBus,
    locks: LockManager,
    intervals: LoopIntervals = LoopIntervals(),
) -> list[DualLoop]:
    """One dual loop per task, all at `intervals` (a quick task with the quick debounce)."""
    return [
        DualLoop(
            task,
            hints,
            locks,
            short_interval_s=intervals.short_interval_s,
            long_interval_s=intervals.long_interval_s,
            debounce_s=_debounce_s(task, intervals),
            lock_linger_s=intervals.lock_linger_s,
        )
        for task in tasks
    ]


def _debounce_s(task: Task, intervals: LoopIntervals) -> float:
    """How long a burst of `task`'s hints gathers: its own batch time, else by its kind."""
    if task.batch_s is not None:
        return task.batch_s
    return intervals.quick_debounce_s if task.quick else intervals.debounce_s


def session_orchestrator(
    coordinator: SessionCoordinator,
    hints: HintBus,
    locks: LockManager,
    *,
    intervals: LoopIntervals = LoopIntervals(),
    grace_period_s: float = 10.0,
) -> Orchestrator:
    """An orchestrator running one dual loop per session task (run it, or `async with` it)."""
    loops = task_loops(coordinator.tasks(), hints, locks, intervals)
    return Orchestrator(loops, grace_period_s=grace_period_s)
