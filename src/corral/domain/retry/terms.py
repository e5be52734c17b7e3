"""The words of a retry policy, without the policy: its bounds, backoff and jitter modes, and
the causes it may retry. The command line's flags name these; they need no pydantic, so
`corral run` imports them without building the policy's model (`policy.py`)."""

from __future__ import annotations

from enum import StrEnum

# A retry chain is at most this many retries long: bounded, so a policy typed with one zero
# too many cannot flood the queue (the admin's kill switch is the other guard).
MAX_RETRIES = 1000
# The hard ceiling of any delay (Airflow's 24 h): also the largest `max_retry_delay` accepted.
MAX_RETRY_DELAY_S = 24 * 3600.0


class BackoffStrategy(StrEnum):
    """How the delay grows from one retry to the next."""

    FIXED = "fixed"  # always `retry_delay`
    EXPONENTIAL = "exponential"  # `retry_delay * backoff_multiplier ** retry_count`, capped


class JitterMode(StrEnum):
    """What is added to the delay so that sessions failing together do not retry together."""

    NONE = "none"
    DETERMINISTIC = "deterministic"  # from SHA1(session id ∥ retry count): reproducible
    RANDOM = "random"  # uniform


class RetryEligibleCause(StrEnum):
    """The failure causes a policy may retry (`classify.CLASSIFICATION` maps corral's causes)."""

    AGENT_TRANSIENT = "agent_transient"  # a lost or restarted agent, a broken way to it
    SCHEDULER_TIMEOUT = "scheduler_timeout"  # a phase ran out of time
    IMAGE_PULL_FAILURE = "image_pull_failure"
    KERNEL_NONZERO_EXIT = "kernel_nonzero_exit"  # the workload failed (or ran past its limit)
    OOM_KILLED = "oom_killed"
    UNKNOWN = "unknown"  # a failure nothing classifies more precisely

    @classmethod
    def defaults(cls) -> frozenset[RetryEligibleCause]:
        """Every eligible cause: `max_retries > 0` alone means "retry on failure"."""
        return frozenset(cls)
