"""How a session ended (its result), why its end was asked for, and what its dependants need.

One definition shared by the writers of `sessions.result` (the promotions, the status changes)
and its readers (the scheduler's dependency check, the API, the CLI).
"""

from __future__ import annotations

from enum import StrEnum

from corral.domain.failure_causes import FailureCause
from corral.domain.status import SESSION_TERMINAL, SessionStatus


class SessionResult(StrEnum):
    """The result of an ended session (Slurm's COMPLETED, FAILED, CANCELLED, TIMEOUT)."""

    SUCCESS = "success"  # it ran and its main kernel exited 0
    FAILURE = "failure"  # it ran and failed (non-zero exit, a failed kernel, a lost agent)
    CANCELLED = "cancelled"  # a user ended it, or it never ran
    TIMEOUT = "timeout"  # it ran past its time limit and was stopped


# Failure causes recorded when a session's end is asked for, before its kernels have stopped.
USER_CANCELLED = FailureCause.USER_CANCELLED
TIME_LIMIT = FailureCause.TIME_LIMIT
INVALID_REQUEST = FailureCause.INVALID_REQUEST

# The result a session whose end was asked for with this cause ends with, however its kernels
# exited on the way (a kernel stopped by SIGTERM exits non-zero: that is no failure of its own).
REQUESTED_RESULTS: dict[str, SessionResult] = {
    USER_CANCELLED: SessionResult.CANCELLED,
    TIME_LIMIT: SessionResult.TIMEOUT,
}


class DependencyKind(StrEnum):
    """When a dependant may start, as Slurm's `--dependency` kinds."""

    AFTEROK = "afterok"  # the dependency ended TERMINATED with result success
    AFTERANY = "afterany"  # the dependency ended, however
    AFTERNOTOK = "afternotok"  # the dependency ended, and not successfully


DEFAULT_DEPENDENCY_KIND = DependencyKind.AFTEROK


# How a session that succeeded ended: `succeeded` and the SQL that selects such sessions
# (`store.retries.record_successes`) read this one pair.
SUCCESS_ENDING = (SessionStatus.TERMINATED, SessionResult.SUCCESS)


def succeeded(status: SessionStatus, result: str | None) -> bool:
    """Whether a session with this status and result ended successfully."""
    return status is SUCCESS_ENDING[0] and result == SUCCESS_ENDING[1]


def dependency_satisfied(
    kind: DependencyKind, status: SessionStatus, result: str | None
) -> bool | None:
    """True: the dependant may run; False: it never can; None: the dependency has not ended."""
    if status not in SESSION_TERMINAL:
        return None
    if kind is DependencyKind.AFTERANY:
        return True
    ok = succeeded(status, result)
    return ok if kind is DependencyKind.AFTEROK else not ok
