"""The hint names: which coordinator task a hint wakes, and which hints a kernel report sets."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from corral.coordination.serving_hints import ServingHint
from corral.domain.status import KERNEL_TERMINAL, SESSION_TERMINAL, KernelStatus, SessionStatus


class Hint(StrEnum):
    """A hint per task of the session coordinator; setting one only wakes the task early."""

    SCHEDULE = "schedule"
    PREPARE = "prepare"
    START = "start"
    TERMINATE = "terminate"
    PROMOTE_PREPARED = "promote-prepared"
    PROMOTE_RUNNING = "promote-running"
    DETECT_TERMINATION = "detect-termination"
    DETECT_FAILURE = "detect-failure-before-running"
    PROMOTE_TERMINATED = "promote-terminated"
    TIME_LIMIT = "time-limit"
    RETRY = "retry"
    ADMISSION = "admission"  # all-or-nothing admission's timeouts (EvictNotReady)
    # Not a coordinator task: agents' desired kernels changed (wakes assignment long-polls).
    ASSIGNMENTS = "assignments"


# The hints that wake promotion tasks.
PROMOTION_HINTS = frozenset(
    {
        Hint.PROMOTE_PREPARED,
        Hint.PROMOTE_RUNNING,
        Hint.DETECT_TERMINATION,
        Hint.DETECT_FAILURE,
        Hint.PROMOTE_TERMINATED,
    }
)

_AFTER_KERNEL_MOVE: dict[KernelStatus, frozenset[Hint]] = {
    KernelStatus.PULLING: frozenset({Hint.PROMOTE_PREPARED}),
    KernelStatus.PREPARED: frozenset({Hint.PROMOTE_PREPARED}),
    KernelStatus.RUNNING: frozenset({Hint.PROMOTE_RUNNING}),
    KernelStatus.TERMINATING: frozenset({Hint.DETECT_TERMINATION}),
    **{
        status: frozenset({Hint.DETECT_TERMINATION, Hint.PROMOTE_TERMINATED})
        for status in KERNEL_TERMINAL
    },
    KernelStatus.ERROR: frozenset(
        {Hint.DETECT_TERMINATION, Hint.DETECT_FAILURE, Hint.PROMOTE_TERMINATED}
    ),
}
_AFTER_STAGE_FAILURE: dict[KernelStatus, Hint] = {
    KernelStatus.PREPARING: Hint.PREPARE,
    KernelStatus.PULLING: Hint.PREPARE,
    KernelStatus.PREPARED: Hint.START,
    KernelStatus.CREATING: Hint.START,
}


def hints_after_report(
    moved_to: Iterable[KernelStatus], failed_stages: Iterable[KernelStatus] = ()
) -> set[Hint]:
    """The tasks to wake after agents moved kernels into `moved_to` or failed these stages."""
    hints: set[Hint] = set()
    for status in moved_to:
        hints |= _AFTER_KERNEL_MOVE.get(status, frozenset())
    for status in failed_stages:
        if status in _AFTER_STAGE_FAILURE:
            hints.add(_AFTER_STAGE_FAILURE[status])
    return hints


# A session's kernels may have moved on before the session did (an agent's batch can carry a
# kernel from RUNNING to TERMINATED while the promotion to RUNNING is still to come): entering
# a status also wakes the promotion that looks at its kernels next, which a report's hint may
# have woken too early, before the session got there. Not so for PREPARING and CREATING: the
# move into them asks the agents for the stage in the same write (`TransitionStatus.ask`), so
# no report of that stage can come before it; the reports wake (or do) the promotion. Woken
# on entry as well, the promotion task ran about ten times a 20,000-session `corral simulate`,
# racing the reports' own promotions for the same sessions (lock waits up to 1.5 s, benchmarks
# session 21). Entering RUNNING is the other exception: the coordinator wakes DetectTermination
# only when a started session's kernel has already ended (`SessionCoordinator._next_hints`),
# since that task scans every running session.
#
# A session's start or end also wakes the route coordinator's tasks that wait for it (a
# replica's route comes up when its session runs, ends when it ends): without them they polled
# every 0.5-1 s. They wake for every session, not only INFERENCE ones (knowing a session's
# type would cost a read per batch): a woken task with no route to look at runs one indexed
# read and sleeps again.
_AFTER_SESSION_MOVE: dict[SessionStatus, frozenset[str]] = {
    SessionStatus.PENDING: frozenset({Hint.SCHEDULE, Hint.ASSIGNMENTS}),
    SessionStatus.SCHEDULED: frozenset({Hint.PREPARE}),
    SessionStatus.PREPARING: frozenset({Hint.ASSIGNMENTS}),
    SessionStatus.PREPARED: frozenset({Hint.START}),
    SessionStatus.CREATING: frozenset({Hint.ASSIGNMENTS}),
    # A session that started may have a time limit: its deadline may be the next one.
    SessionStatus.RUNNING: frozenset({Hint.TIME_LIMIT, ServingHint.PROVISION_ROUTES}),
    SessionStatus.TERMINATING: frozenset({Hint.TERMINATE, Hint.PROMOTE_TERMINATED}),
    # An ended session frees capacity and may unblock sessions that depend on it; if it has a
    # retry policy, its retry is to be decided.
    **{
        status: frozenset(
            {
                Hint.SCHEDULE,
                Hint.ASSIGNMENTS,
                Hint.RETRY,
                ServingHint.PROVISION_ROUTES,
                ServingHint.CHECK_RUNNING_ROUTES,
            }
        )
        for status in SESSION_TERMINAL
    },
}


def hints_after_moves(moved_to: Iterable[SessionStatus]) -> set[str]:
    """The next phases (sessions' and routes') to wake after sessions moved into `moved_to`."""
    hints: set[str] = set()
    for status in moved_to:
        hints |= _AFTER_SESSION_MOVE.get(status, frozenset())
    return hints
