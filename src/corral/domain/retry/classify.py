"""Which failures a retry policy may retry: every corral failure cause, classified once.

`CLASSIFICATION` maps each `FailureCause` to a `RetryEligibleCause` (a policy's
`eligible_causes` decide) or to a `NeverRetried` cause, which no policy can opt in: a user's
cancellation, a request that can never run as submitted, a quota. A test checks that every
cause corral can record is in the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from corral.domain.failure_causes import FailureCause as F
from corral.domain.outcome import SessionResult
from corral.domain.retry.policy import RetryEligibleCause as E
from corral.domain.status import SESSION_TERMINAL, SessionStatus


class NeverRetried(StrEnum):
    """Causes that are permanent by definition: hard-coded, no policy can retry them."""

    USER_CANCELLED = "user_cancelled"
    VALIDATION_ERROR = "validation_error"
    QUOTA_EXCEEDED = "quota_exceeded"


FailureClass = E | NeverRetried

CLASSIFICATION: Mapping[F, FailureClass] = MappingProxyType(
    {
        # The workload. A time limit is the workload's own failure to finish (its kernel is
        # stopped and exits non-zero), as Airflow retries a task's timeout.
        F.KERNEL_NONZERO_EXIT: E.KERNEL_NONZERO_EXIT,
        F.TIME_LIMIT: E.KERNEL_NONZERO_EXIT,
        F.OOM_KILLED: E.OOM_KILLED,
        F.OUTPUT_TOO_LARGE: E.UNKNOWN,
        F.KERNEL_FAILED: E.UNKNOWN,
        # Agents, and the way between agents and managers.
        F.AGENT_LOST: E.AGENT_TRANSIENT,
        F.AGENT_UNAVAILABLE: E.AGENT_TRANSIENT,
        F.AGENT_SHUTDOWN: E.AGENT_TRANSIENT,
        F.KERNEL_LOST: E.AGENT_TRANSIENT,
        F.AGENT_IO_ERROR: E.AGENT_TRANSIENT,
        F.DEVICE_UNAVAILABLE: E.AGENT_TRANSIENT,
        F.MANAGER_UNREACHABLE: E.AGENT_TRANSIENT,
        F.MANAGER_REFUSED: E.AGENT_TRANSIENT,
        F.WORK_DIR_FAILURE: E.AGENT_TRANSIENT,
        # Stages before the workload runs.
        F.IMAGE_PULL_FAILURE: E.IMAGE_PULL_FAILURE,
        F.KERNEL_START_FAILURE: E.UNKNOWN,
        F.UPLOAD_FAILURE: E.UNKNOWN,
        F.STAGE_FAILED: E.UNKNOWN,
        # The manager's phases.
        F.PHASE_TIMEOUT: E.SCHEDULER_TIMEOUT,
        F.KERNELS_READY_TIMEOUT: E.SCHEDULER_TIMEOUT,
        F.DEACTIVATED_RETENTION: E.SCHEDULER_TIMEOUT,
        # Never: asked for, or impossible as submitted.
        F.USER_CANCELLED: NeverRetried.USER_CANCELLED,
        F.DEPENDENCY_MISSING: NeverRetried.VALIDATION_ERROR,
        F.DEPENDENCY_FAILED: NeverRetried.VALIDATION_ERROR,
        F.UNKNOWN_SLOT: NeverRetried.VALIDATION_ERROR,
        F.REQUEST_TOO_LARGE: NeverRetried.VALIDATION_ERROR,
        F.INVALID_REQUEST: NeverRetried.VALIDATION_ERROR,
        F.QUOTA_EXCEEDED: NeverRetried.QUOTA_EXCEEDED,
    }
)
_BY_CODE: Mapping[str, FailureClass] = {cause.value: cls for cause, cls in CLASSIFICATION.items()}
# Results of a TERMINATED session that count as failed (a run that did not succeed).
_FAILED_RESULTS = frozenset({SessionResult.FAILURE.value, SessionResult.TIMEOUT.value})


def retries_on_failure(status: SessionStatus, result: str | None) -> bool:
    """Whether a session that ended so may be retried at all: ERROR, or TERMINATED with a
    failed result (failure, timeout). A cancelled session never is (DESIGN.md)."""
    if status is SessionStatus.ERROR:
        return True
    return status is SessionStatus.TERMINATED and result in _FAILED_RESULTS


def classify_failure(
    status: SessionStatus, result: str | None, cause: str | None
) -> FailureClass | None:
    """The class of a session's failure (None: it has not ended, or it succeeded).

    `cause` is the session's failure cause; a cause this table does not know is UNKNOWN. A
    session with no cause was cancelled before it ran (CANCELLED), ended TERMINATED because
    its main kernel exited non-zero, or failed without saying why.
    """
    if status not in SESSION_TERMINAL:
        return None
    if status is SessionStatus.TERMINATED and result == SessionResult.SUCCESS.value:
        return None
    if cause is not None:
        return _BY_CODE.get(cause, E.UNKNOWN)
    if status is SessionStatus.CANCELLED or result == SessionResult.CANCELLED.value:
        return NeverRetried.USER_CANCELLED
    if status is SessionStatus.TERMINATED:
        return E.KERNEL_NONZERO_EXIT
    return E.UNKNOWN
