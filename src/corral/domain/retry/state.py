"""`retry_state`: where a session stands in its retry chain, in words, for the API and CLI."""

from __future__ import annotations

import uuid
from datetime import datetime

from corral.domain.record import record
from corral.domain.retry.classify import classify_failure, retries_on_failure
from corral.domain.status import SESSION_TERMINAL, SessionStatus


@record
class ChainLink:
    """One attempt of a retry chain, as the state and the attempts listing show it."""

    id: uuid.UUID
    number: int
    status: SessionStatus
    result: str | None
    failure_cause: str | None
    retry_count: int
    max_retries: int
    retry_decision: str | None
    starts_at: datetime | None


def retry_state(
    session: ChainLink, child: ChainLink | None, *, paused: bool, now: datetime
) -> str | None:
    """ "attempt 2 of 4", "retry scheduled at T (attempt 3 of 4)", "retries exhausted", ...

    None for a session without retries (no policy, never a retry). `child` is its retry, if
    one was created; `paused` whether an admin paused automatic retries.
    """
    if session.max_retries == 0 and session.retry_count == 0:
        return None
    attempt, attempts = session.retry_count + 1, session.max_retries + 1
    of = f"attempt {attempt} of {attempts}"
    if session.status not in SESSION_TERMINAL:
        if session.status is SessionStatus.PENDING and _later(session.starts_at, now):
            return f"{of}, starts at {_moment(session.starts_at)}"
        return of
    decision = session.retry_decision
    if decision == "scheduled" and child is not None:
        if child.status is SessionStatus.PENDING and _later(child.starts_at, now):
            return (
                f"retry scheduled at {_moment(child.starts_at)} "
                f"(attempt {attempt + 1} of {attempts}: session {child.number})"
            )
        return f"retried: attempt {attempt + 1} of {attempts} is session {child.number}"
    if decision == "exhausted":
        return f"retries exhausted: {of} failed"
    if decision == "succeeded":
        return f"{of} succeeded"
    if decision == "stopped":
        return f"{of}; the retry chain was stopped by a terminate request"
    cause = classify_failure(session.status, session.result, session.failure_cause)
    if decision == "not_retried":
        if cause is None or not retries_on_failure(session.status, session.result):
            return f"{of}; not retried: it did not fail"
        return f"{of}; not retried: {cause.value} is not retried"
    if cause is None:
        return f"{of} succeeded"
    if paused:
        return f"{of} failed; retry on hold: automatic retries are paused by an admin"
    return f"{of} failed; deciding the retry"


def _later(moment: datetime | None, now: datetime) -> bool:
    return moment is not None and moment > now


def _moment(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")
