"""The judge against spec document 1: every lifecycle handler with every result."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.coordination.judge import PhaseLimits, judge, judge_failure
from corral.domain.results import (
    HandlerResult,
    ResultNote,
    SchedulingResult,
    StatusTransitions,
    TransitionStatus,
)
from corral.domain.session import SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId, UserId

S, K, R = SessionStatus, KernelStatus, SchedulingResult
NOW = datetime(2030, 1, 1, tzinfo=UTC)

# Spec document 1, "StatusTransitions" of the four lifecycle handlers, written out by hand.
SPEC_HANDLERS = {
    "ScheduleNewSessions": (
        frozenset({S.PENDING}),
        StatusTransitions(
            success=TransitionStatus(S.SCHEDULED, K.SCHEDULED),
            need_retry=None,
            expired=TransitionStatus(S.CANCELLED, K.CANCELLED),
            give_up=TransitionStatus(S.CANCELLED, K.CANCELLED),
        ),
    ),
    "PrepareSessions": (
        frozenset({S.SCHEDULED, S.PREPARING}),
        StatusTransitions(
            success=TransitionStatus(S.PREPARING, K.PREPARING),
            need_retry=None,
            expired=TransitionStatus(S.PENDING, K.PENDING),
            give_up=TransitionStatus(S.PENDING, K.PENDING),
        ),
    ),
    "StartSessions": (
        frozenset({S.PREPARED}),
        StatusTransitions(
            success=TransitionStatus(S.CREATING, K.CREATING),
            need_retry=None,
            expired=TransitionStatus(S.PENDING, K.PENDING),
            give_up=TransitionStatus(S.PENDING, K.PENDING),
        ),
    ),
    "TerminateSessions": (
        frozenset({S.TERMINATING}),
        StatusTransitions(
            success=TransitionStatus(S.TERMINATED, K.TERMINATED),
            need_retry=None,
            expired=TransitionStatus(S.TERMINATED, K.TERMINATED),
            give_up=TransitionStatus(S.TERMINATED, K.TERMINATED),
        ),
    ),
}
# The spec's table: handler → the session status after SUCCESS, NEED_RETRY (None: maintained),
# EXPIRED and GIVE_UP.
_SPEC_COLUMNS = (R.SUCCESS, R.NEED_RETRY, R.EXPIRED, R.GIVE_UP)
SPEC_TABLE = {
    handler: dict(zip(_SPEC_COLUMNS, row, strict=True))
    for handler, row in {
        "ScheduleNewSessions": (S.SCHEDULED, None, S.CANCELLED, S.CANCELLED),
        "PrepareSessions": (S.PREPARING, None, S.PENDING, S.PENDING),
        "StartSessions": (S.CREATING, None, S.PENDING, S.PENDING),
        "TerminateSessions": (S.TERMINATED, None, S.TERMINATED, S.TERMINATED),
    }.items()
}


def target(
    status: SessionStatus, *, phase: str | None = None, attempts: int = 0, age_s: float = 0
) -> SessionWithKernels:
    """A session in `status` for `age_s` seconds with `attempts` failed attempts in `phase`."""
    return SessionWithKernels(
        id=SessionId(uuid.uuid4()),
        name=None,
        owner_id=UserId(uuid.uuid4()),
        type="BATCH",
        priority=0,
        resource_group="default",
        cluster_mode="single-node",
        cluster_size=1,
        status=status,
        status_info=None,
        status_changed_at=NOW - timedelta(seconds=age_s),
        created_at=NOW - timedelta(seconds=age_s),
        starts_at=None,
        requeue_at=None,
        requeue_active=True,
        phase=phase,
        phase_attempts=attempts,
        failed_agents=(),
        creation_id=None,
        kernels=(),
    )


def run(
    handler: str, session: SessionWithKernels, result: HandlerResult, limits: PhaseLimits
) -> dict[SchedulingResult, tuple[TransitionStatus | None, bool]]:
    expected, transitions = SPEC_HANDLERS[handler]
    changes = judge(
        phase=handler,
        expected=expected,
        transitions=transitions,
        targets=[session],
        result=result,
        limits=lambda _s: limits,
        now=NOW,
    )
    assert all(list(c.session_ids) == [session.id] for c in changes)
    return {c.result: (c.target, c.count_attempt) for c in changes}


@pytest.mark.parametrize("handler", list(SPEC_TABLE))
@pytest.mark.parametrize("outcome", [R.SUCCESS, R.NEED_RETRY, R.EXPIRED, R.GIVE_UP, R.SKIPPED])
def test_every_handler_and_result_follows_the_spec_table(handler: str, outcome: R) -> None:
    """Each handler's judged outcome moves the session exactly as spec document 1's table says."""
    expected, _ = SPEC_HANDLERS[handler]
    session = target(next(iter(sorted(expected))), phase=handler, attempts=1, age_s=100)
    limits = PhaseLimits(max_attempts=5, timeout_s=50 if outcome is R.EXPIRED else None)
    result = HandlerResult()
    if outcome is R.SUCCESS:
        result.successes.append(session.id)
    elif outcome is R.SKIPPED:
        result.skipped.append(session.id)
    else:
        result.failures.append(session.id)
        if outcome is R.GIVE_UP:
            limits = PhaseLimits(max_attempts=2)  # attempts 1 → 2 reaches the limit
    judged = run(handler, session, result, limits)
    assert list(judged) == [outcome]
    move, counted = judged[outcome]
    if outcome is R.SKIPPED:
        assert move is None and not counted
        return
    assert (move.session if move else None) == SPEC_TABLE[handler][outcome]
    assert counted == (outcome is R.NEED_RETRY)


def test_give_up_wins_over_expired_and_expired_over_retry() -> None:
    """First match wins: the attempt limit before the timeout, the timeout before a retry."""
    both = PhaseLimits(max_attempts=3, timeout_s=10)
    assert judge_failure(attempts=3, elapsed_s=99, limits=both) is R.GIVE_UP
    assert judge_failure(attempts=2, elapsed_s=99, limits=both) is R.EXPIRED
    assert judge_failure(attempts=2, elapsed_s=5, limits=both) is R.NEED_RETRY
    assert judge_failure(attempts=1, elapsed_s=0, limits=both, permanent=True) is R.GIVE_UP


def test_attempts_count_per_phase_and_restart_in_a_new_phase() -> None:
    """Attempts carried from another phase do not count; those of this phase do."""
    limits = PhaseLimits(max_attempts=3)
    failed = HandlerResult()
    other_phase = target(S.SCHEDULED, phase="ScheduleNewSessions", attempts=2)
    failed.failures.append(other_phase.id)
    assert list(run("PrepareSessions", other_phase, failed, limits)) == [R.NEED_RETRY]
    same_phase = target(S.SCHEDULED, phase="PrepareSessions", attempts=2)
    failed = HandlerResult(failures=[same_phase.id])
    assert list(run("PrepareSessions", same_phase, failed, limits)) == [R.GIVE_UP]


def test_skips_never_count_and_untouched_sessions_only_expire() -> None:
    """A skipped session is recorded as SKIPPED; one not mentioned at all is left alone unless
    its phase has timed out."""
    limits = PhaseLimits(max_attempts=1, timeout_s=60)
    skipped = target(S.PENDING, age_s=10)
    assert run("ScheduleNewSessions", skipped, HandlerResult(skipped=[skipped.id]), limits) == {
        R.SKIPPED: (None, False)
    }
    quiet = target(S.PENDING, age_s=10)
    assert run("ScheduleNewSessions", quiet, HandlerResult(), limits) == {}
    stale = target(S.PENDING, age_s=61)
    judged = run("ScheduleNewSessions", stale, HandlerResult(skipped=[stale.id]), limits)
    assert list(judged) == [R.EXPIRED]


def test_notes_travel_with_their_sessions_and_permanent_failures_give_up_at_once() -> None:
    """A permanent failure gives up on the first attempt and keeps its note for the history."""
    session = target(S.PENDING)
    note = ResultNote("dependency_failed", "depends on a session that failed", permanent=True)
    expected, transitions = SPEC_HANDLERS["ScheduleNewSessions"]
    [change] = judge(
        phase="ScheduleNewSessions",
        expected=expected,
        transitions=transitions,
        targets=[session],
        result=HandlerResult(failures=[session.id], notes={session.id: note}),
        limits=lambda _s: PhaseLimits(),
        now=NOW,
    )
    assert change.result is R.GIVE_UP and change.notes == {session.id: note}
    assert change.target == TransitionStatus(S.CANCELLED, K.CANCELLED)


@given(
    attempts=st.integers(min_value=1, max_value=10_000),
    elapsed=st.floats(min_value=0, max_value=1e9, allow_nan=False),
    max_attempts=st.integers(min_value=1, max_value=100),
    timeout=st.one_of(st.none(), st.floats(min_value=0, max_value=1e9, allow_nan=False)),
)
def test_judge_failure_is_total_and_ordered(
    attempts: int, elapsed: float, max_attempts: int, timeout: float | None
) -> None:
    """Every input gets exactly the first matching rule, never an exception."""
    result = judge_failure(
        attempts=attempts,
        elapsed_s=elapsed,
        limits=PhaseLimits(max_attempts=max_attempts, timeout_s=timeout),
    )
    if attempts >= max_attempts:
        assert result is R.GIVE_UP
    elif timeout is not None and elapsed > timeout:
        assert result is R.EXPIRED
    else:
        assert result is R.NEED_RETRY
