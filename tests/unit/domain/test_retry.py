"""domain.retry: the backoff formula, its invariants, the classification table, the layers."""

from __future__ import annotations

import dataclasses
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from corral.domain.failure_causes import FailureCause
from corral.domain.retry.backoff import retry_delay
from corral.domain.retry.classify import CLASSIFICATION, NeverRetried, classify_failure
from corral.domain.retry.decide import (
    EndedAttempt,
    RetryDecision,
    child_creation_id,
    decide,
)
from corral.domain.retry.policy import (
    MAX_RETRY_DELAY_S,
    RetryEligibleCause,
    RetryPolicy,
    effective_policy,
)
from corral.domain.retry.state import ChainLink, retry_state
from corral.domain.spec import MAX_CREATION_ID_LENGTH, SessionSpec
from corral.domain.status import SessionStatus

S = SessionStatus
E = RetryEligibleCause
SID = uuid.UUID("01900000-0000-7000-8000-000000000000")
NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fields", "count", "expected"),
    [
        ({"retry_delay": 60}, 0, 60.0),
        ({"retry_delay": 60}, 7, 60.0),  # fixed: the same every time
        ({"retry_delay": 10, "backoff": "exponential"}, 0, 10.0),
        ({"retry_delay": 10, "backoff": "exponential"}, 1, 20.0),
        ({"retry_delay": 10, "backoff": "exponential"}, 3, 80.0),
        ({"retry_delay": 10, "backoff": "exponential", "backoff_multiplier": 3}, 2, 90.0),
        ({"retry_delay": 10, "backoff": "exponential", "max_retry_delay": 50}, 3, 50.0),
        ({"retry_delay": 10, "backoff": "exponential"}, 9, 3600.0),  # the default cap, 1 h
        ({"retry_delay": 10, "backoff": "exponential", "max_retry_delay": None}, 20, 86400.0),
        ({"retry_delay": 7200, "max_retry_delay": 3600}, 0, 3600.0),  # fixed is capped too
        ({"retry_delay": 0, "backoff": "exponential"}, 5, 0.0),
    ],
)
def test_the_delay_is_the_spec_formula(
    fields: dict[str, object], count: int, expected: float
) -> None:
    """Without jitter: retry_delay, or retry_delay·multiplier^count, capped."""
    policy = RetryPolicy.model_validate({**fields, "jitter": "none"})
    assert retry_delay(policy, SID, count) == pytest.approx(expected)


def test_deterministic_jitter_is_sha1_of_the_session_and_count() -> None:
    """The same session and count always wait the same; another count another amount."""
    policy = RetryPolicy(retry_delay=100, jitter_ratio=0.5)
    first = retry_delay(policy, SID, 0)
    assert first == retry_delay(policy, SID, 0)
    assert 100 <= first < 150
    assert retry_delay(policy, SID, 1) != first
    assert retry_delay(policy, uuid.UUID(int=SID.int + 1), 0) != first


def test_random_jitter_is_in_base_to_base_times_one_plus_ratio() -> None:
    """Random jitter: uniform in [base, base·(1+ratio))."""
    policy = RetryPolicy(retry_delay=100, jitter="random", jitter_ratio=0.2)
    rng = random.Random(7)
    delays = [retry_delay(policy, SID, 0, rng=rng) for _ in range(200)]
    assert all(100 <= d < 120 for d in delays)
    assert len(set(delays)) > 100


policies = st.builds(
    RetryPolicy,
    retry_delay=st.floats(0, MAX_RETRY_DELAY_S),
    backoff=st.sampled_from(["fixed", "exponential"]),
    backoff_multiplier=st.floats(0.01, 1000),
    max_retry_delay=st.none() | st.floats(0.001, MAX_RETRY_DELAY_S),
    jitter=st.sampled_from(["none", "deterministic", "random"]),
    jitter_ratio=st.floats(0, 1),
)


@given(policies, st.uuids(), st.integers(0, 10_000))
def test_a_delay_is_never_negative_nor_above_its_cap(
    policy: RetryPolicy, session_id: uuid.UUID, count: int
) -> None:
    """Whatever the policy and attempt (10,000 included): 0 ≤ delay ≤ max_retry_delay ≤ 24 h."""
    delay = retry_delay(policy, session_id, count, rng=random.Random(count))
    assert 0.0 <= delay <= (policy.max_retry_delay or MAX_RETRY_DELAY_S) <= MAX_RETRY_DELAY_S
    NOW + timedelta(seconds=delay)  # the date arithmetic never overflows


@given(policies, st.uuids(), st.integers(0, 10_000))
def test_deterministic_jitter_is_reproducible_and_within_its_ratio(
    policy: RetryPolicy, session_id: uuid.UUID, count: int
) -> None:
    """Deterministic jitter: the same inputs give the same delay, at most ratio above base."""
    jittered = policy.model_copy(update={"jitter": "deterministic"})
    plain = policy.model_copy(update={"jitter": "none"})
    base = retry_delay(plain, session_id, count)
    delay = retry_delay(jittered, session_id, count)
    assert delay == retry_delay(jittered, session_id, count)
    assert base <= delay <= base * (1 + policy.jitter_ratio) + 1e-9


def test_attempt_ten_thousand_and_a_zero_delay_are_safe() -> None:
    """Airflow's traps: no overflow at a huge count, no modulo by zero at a zero delay."""
    huge = RetryPolicy(retry_delay=1, backoff="exponential", backoff_multiplier=1000)
    assert retry_delay(huge, SID, 10_000) == 3600.0
    zero = RetryPolicy(retry_delay=0, backoff="exponential", jitter="deterministic")
    assert retry_delay(zero, SID, 10_000) == 0.0
    assert retry_delay(zero.model_copy(update={"jitter": "random"}), SID, 3) == 0.0


def test_every_failure_cause_corral_records_is_classified() -> None:
    """The table covers the FailureCause enum exactly (a new cause must be classified)."""
    assert set(CLASSIFICATION) == set(FailureCause)


@pytest.mark.parametrize(
    ("status", "result", "cause", "expected"),
    [
        (S.ERROR, "failure", "kernel_nonzero_exit", E.KERNEL_NONZERO_EXIT),
        (S.ERROR, "failure", "oom_killed", E.OOM_KILLED),
        (S.ERROR, "failure", "agent_lost", E.AGENT_TRANSIENT),
        (S.ERROR, "failure", "kernel_lost", E.AGENT_TRANSIENT),
        (S.ERROR, "failure", "image_pull_failure", E.IMAGE_PULL_FAILURE),
        (S.TERMINATED, "failure", "phase_timeout", E.SCHEDULER_TIMEOUT),
        (S.TERMINATED, "timeout", "time_limit", E.KERNEL_NONZERO_EXIT),
        (S.TERMINATED, "failure", None, E.KERNEL_NONZERO_EXIT),  # main kernel exited non-zero
        (S.ERROR, "failure", "something_new", E.UNKNOWN),
        (S.ERROR, "failure", None, E.UNKNOWN),
        (S.TERMINATED, "cancelled", "user_cancelled", NeverRetried.USER_CANCELLED),
        (S.CANCELLED, "cancelled", None, NeverRetried.USER_CANCELLED),
        (S.CANCELLED, "cancelled", "request_too_large", NeverRetried.VALIDATION_ERROR),
        (S.CANCELLED, "cancelled", "quota_exceeded", NeverRetried.QUOTA_EXCEEDED),
        (S.TERMINATED, "success", None, None),
        (S.RUNNING, None, None, None),
    ],
)
def test_classification(
    status: SessionStatus, result: str | None, cause: str | None, expected: object
) -> None:
    """Each way a session ends, in its class."""
    assert classify_failure(status, result, cause) == expected


def _ended(**fields: object) -> EndedAttempt:
    defaults: dict[str, object] = dict(
        id=SID,
        type="BATCH",
        status=S.ERROR,
        result="failure",
        failure_cause="kernel_nonzero_exit",
        retry_count=0,
        max_retries=2,
        policy=RetryPolicy(max_retries=2, retry_delay=30, jitter="none"),
        creation_id="abc",
        ended_at=NOW,
    )
    return EndedAttempt(**{**defaults, **fields})  # type: ignore[arg-type]


def test_decisions() -> None:
    """Scheduled with its delay and id; exhausted; never retried; not batch; succeeded."""
    scheduled = decide(_ended())
    assert scheduled.decision is RetryDecision.SCHEDULED
    assert scheduled.not_before == NOW + timedelta(seconds=30)
    assert scheduled.child_creation_id == "abc:retry:1"
    assert decide(_ended(retry_count=2)).decision is RetryDecision.EXHAUSTED
    cancelled = _ended(status=S.TERMINATED, result="cancelled", failure_cause="user_cancelled")
    assert decide(cancelled).decision is RetryDecision.NOT_RETRIED
    assert decide(_ended(type="INTERACTIVE")).decision is RetryDecision.NOT_RETRIED
    only_oom = RetryPolicy(max_retries=2, eligible_causes=frozenset({E.OOM_KILLED}))
    assert decide(_ended(policy=only_oom)).decision is RetryDecision.NOT_RETRIED
    success = _ended(status=S.TERMINATED, result="success", failure_cause=None)
    assert decide(success).decision is RetryDecision.SUCCEEDED


def test_child_creation_ids_derive_from_the_first_attempt() -> None:
    """first:retry:1, first:retry:2, ...; a missing or too long first id uses the session id."""
    assert child_creation_id(SID, "job", 0) == "job:retry:1"
    assert child_creation_id(SID, "job:retry:1", 1) == "job:retry:2"
    assert child_creation_id(SID, None, 0) == f"{SID}:retry:1"
    long = "x" * MAX_CREATION_ID_LENGTH
    assert child_creation_id(SID, long, 0) == f"{SID}:retry:1"
    assert len(child_creation_id(SID, "y" * 117, 999)) <= MAX_CREATION_ID_LENGTH


def test_layers_merge_session_over_group_over_cluster() -> None:
    """Each layer's given fields win over the layers under it; the rest come from below."""
    cluster = RetryPolicy(retry_delay=5, jitter="none")
    group = RetryPolicy.model_validate({"max_retries": 3, "retry_delay": 20})
    session = RetryPolicy.model_validate({"backoff": "exponential", "eligible_causes": ["unknown"]})
    merged = effective_policy(cluster, group, session)
    assert (merged.max_retries, merged.retry_delay, merged.backoff) == (3, 20, "exponential")
    assert merged.jitter == "none"
    assert merged.eligible_causes == frozenset({E.UNKNOWN})
    assert effective_policy(RetryPolicy(), None, None).max_retries == 0  # the shipped default


def test_invalid_policies_are_refused_naming_the_field() -> None:
    """Negative counts, delays over 24 h, an unknown cause, and retries of an interactive one."""
    for bad in (
        {"max_retries": -1},
        {"retry_delay": -1},
        {"max_retry_delay": 2 * MAX_RETRY_DELAY_S},
        {"jitter_ratio": 1.5},
        {"eligible_causes": ["user_cancelled"]},
    ):
        with pytest.raises(ValidationError) as raised:
            RetryPolicy.model_validate(bad)
        assert raised.value.errors()[0]["loc"][0] == next(iter(bad))
    with pytest.raises(ValidationError, match="only BATCH sessions"):
        SessionSpec.model_validate(
            {"image": "python", "type": "INTERACTIVE", "retry_policy": {"max_retries": 1}}
        )


def _link(**fields: object) -> ChainLink:
    defaults: dict[str, object] = dict(
        id=SID,
        number=1,
        status=S.RUNNING,
        result=None,
        failure_cause=None,
        retry_count=0,
        max_retries=3,
        retry_decision=None,
        starts_at=None,
    )
    return ChainLink(**{**defaults, **fields})  # type: ignore[arg-type]


def test_retry_state_in_words() -> None:
    """attempt N of M; retry scheduled at T; retries exhausted; paused; none without retries."""
    assert retry_state(_link(), None, paused=False, now=NOW) == "attempt 1 of 4"
    failed = _link(status=S.ERROR, result="failure", failure_cause="oom_killed")
    later = NOW + timedelta(seconds=30)
    child = _link(number=2, status=S.PENDING, retry_count=1, starts_at=later)
    scheduled = dataclasses.replace(failed, retry_decision="scheduled")
    assert retry_state(scheduled, child, paused=False, now=NOW) == (
        "retry scheduled at 2030-01-01T00:00:30Z (attempt 2 of 4: session 2)"
    )
    exhausted = _link(status=S.ERROR, retry_count=3, retry_decision="exhausted")
    assert retry_state(exhausted, None, paused=False, now=NOW) == (
        "retries exhausted: attempt 4 of 4 failed"
    )
    assert "paused by an admin" in (retry_state(failed, None, paused=True, now=NOW) or "")
    assert retry_state(_link(max_retries=0), None, paused=False, now=NOW) is None
