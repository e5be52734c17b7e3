"""The retry decision for one ended session: pure, so the handler decides a batch at once.

A BATCH session that failed (`classify.retries_on_failure`), with an eligible cause and retries
left, gets a child: the same spec, `retry_count + 1`, its own deterministic `creation_id`
(`child_creation_id`), not to start before the parent's end plus the backoff delay. The
decision is recorded on the parent (`sessions.retry_decision`), which is also what makes the
handler look at a session once.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta
from enum import StrEnum

from corral.domain.outcome import succeeded
from corral.domain.record import record
from corral.domain.retry.backoff import retry_delay
from corral.domain.retry.classify import (
    FailureClass,
    NeverRetried,
    classify_failure,
    retries_on_failure,
)
from corral.domain.retry.policy import MAX_RETRIES, RetryPolicy
from corral.domain.spec import MAX_CREATION_ID_LENGTH, SessionType
from corral.domain.status import SessionStatus


class RetryDecision(StrEnum):
    """What became of an ended session with a retry policy (`sessions.retry_decision`)."""

    SCHEDULED = "scheduled"  # its retry (the child) exists
    EXHAUSTED = "exhausted"  # it failed with no retries left
    NOT_RETRIED = "not_retried"  # it did not fail, or not for a cause its policy retries
    SUCCEEDED = "succeeded"  # it ended successfully
    STOPPED = "stopped"  # a terminate request stopped its chain


RETRY_SUFFIX = ":retry:"
# A first attempt's creation_id longer than this makes its retries' ids from the session id:
# the suffix of the longest chain must still fit the column.
_MAX_BASE = MAX_CREATION_ID_LENGTH - len(RETRY_SUFFIX) - len(str(MAX_RETRIES))


@record
class EndedAttempt:
    """What the decision needs of an ended session."""

    id: uuid.UUID
    type: str
    status: SessionStatus
    result: str | None
    failure_cause: str | None
    retry_count: int
    max_retries: int
    policy: RetryPolicy | None
    creation_id: str | None
    ended_at: datetime


@record
class RetryVerdict:
    """The decision for one session; for SCHEDULED, when its child may start and its id."""

    decision: RetryDecision
    cause: FailureClass | None = None
    delay_s: float | None = None
    not_before: datetime | None = None
    child_creation_id: str | None = None


def decide(ended: EndedAttempt, *, rng: random.Random | None = None) -> RetryVerdict:
    """Retry `ended` or not: succeeded, not retried (cancelled, not batch, a cause its policy
    does not retry or none may), exhausted, or scheduled with its delay."""
    if succeeded(ended.status, ended.result):
        return RetryVerdict(RetryDecision.SUCCEEDED)
    cause = classify_failure(ended.status, ended.result, ended.failure_cause)
    policy = ended.policy
    if (
        policy is None
        or ended.type != SessionType.BATCH
        or not retries_on_failure(ended.status, ended.result)
        or isinstance(cause, NeverRetried)
        or cause not in policy.eligible_causes
    ):
        return RetryVerdict(RetryDecision.NOT_RETRIED, cause)
    if ended.retry_count >= ended.max_retries:
        return RetryVerdict(RetryDecision.EXHAUSTED, cause)
    delay_s = retry_delay(policy, ended.id, ended.retry_count, rng=rng)
    return RetryVerdict(
        RetryDecision.SCHEDULED,
        cause,
        delay_s,
        ended.ended_at + timedelta(seconds=delay_s),
        child_creation_id(ended.id, ended.creation_id, ended.retry_count),
    )


def child_creation_id(parent_id: uuid.UUID, creation_id: str | None, retry_count: int) -> str:
    """The creation_id of the retry of a session: its chain's base + ":retry:" + attempt.

    The base is the first attempt's creation_id (or, without one or when too long, the first
    attempt's id); a retry's own creation_id carries it, so every attempt's id derives from
    its parent alone. Two managers deciding the same failure write the same id, and the
    unique index on (owner, creation_id) lets one of them create it.
    """
    if retry_count > 0 and creation_id is not None and RETRY_SUFFIX in creation_id:
        base = creation_id.rsplit(RETRY_SUFFIX, 1)[0]
    elif creation_id is not None and len(creation_id) <= _MAX_BASE:
        base = creation_id
    else:
        base = str(parent_id)
    return f"{base}{RETRY_SUFFIX}{retry_count + 1}"
