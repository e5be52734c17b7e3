"""`RetryPolicy`: when and how a failed batch session is run again (spec document 5's schema).

Three layers give a session its policy, deep-merged top-down with the most specific winning:
the create request's `retry_policy`, its resource group's `retry_policy` option (admins), and
the cluster default (the manager's `retry_policy_default` setting; `max_retries=0` as shipped,
so nothing is retried unless someone opts in). A layer holds only the fields it sets
(`model_fields_set`); the merged, effective policy is stored on the session.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_serializer

from corral.domain.retry.terms import (
    MAX_RETRIES,
    MAX_RETRY_DELAY_S,
    BackoffStrategy,
    JitterMode,
    RetryEligibleCause,
)

__all__ = [
    "MAX_RETRIES",
    "MAX_RETRY_DELAY_S",
    "BackoffStrategy",
    "JitterMode",
    "RetryEligibleCause",
    "RetryPolicy",
    "effective_policy",
]


class RetryPolicy(BaseModel):
    """When a failed BATCH session is retried, after how long, and on which causes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Retries after the first attempt: a session runs at most 1 + max_retries times.
    max_retries: int = Field(default=0, ge=0, le=MAX_RETRIES)
    # Seconds before the first retry. 0 is allowed (retry at once), unlike the spec's
    # PositiveFloat: every step of the formula is safe with it.
    retry_delay: float = Field(default=60.0, ge=0, le=MAX_RETRY_DELAY_S, allow_inf_nan=False)
    backoff: BackoffStrategy = BackoffStrategy.FIXED
    backoff_multiplier: float = Field(default=2.0, gt=0, le=1000, allow_inf_nan=False)
    # The largest delay, seconds (None: the 24 h ceiling).
    max_retry_delay: float | None = Field(
        default=3600.0, gt=0, le=MAX_RETRY_DELAY_S, allow_inf_nan=False
    )
    jitter: JitterMode = JitterMode.DETERMINISTIC
    jitter_ratio: float = Field(default=0.25, ge=0, le=1, allow_inf_nan=False)
    eligible_causes: frozenset[RetryEligibleCause] = Field(
        default_factory=RetryEligibleCause.defaults
    )
    # Whether `session.retry_scheduled` / `session.retry_exhausted` events are published (the
    # audit entry of a dispatch, on the retry's `session.created`, is written regardless).
    emit_retry_events: StrictBool = True

    @field_serializer("eligible_causes")
    def _sorted_causes(self, causes: frozenset[RetryEligibleCause]) -> list[str]:
        return sorted(cause.value for cause in causes)

    def layer(self) -> dict[str, Any]:
        """The fields this layer sets, as JSON values (what it contributes to a merge)."""
        return self.model_dump(mode="json", include=set(self.model_fields_set))


def effective_policy(cluster: RetryPolicy, *layers: RetryPolicy | None) -> RetryPolicy:
    """`cluster` with each layer's set fields on top, later layers winning (group, session).

    Deep-merged: the policy's fields are flat, and a set (`eligible_causes`) is one value, so a
    layer that names causes replaces the whole set rather than adding to it.
    """
    merged = cluster.model_dump(mode="json")
    for layer in layers:
        if layer is not None:
            merged |= layer.layer()
    return RetryPolicy.model_validate(merged)
