"""All-or-nothing admission (spec document 2): a resource group's options and the requeue math.

A group that enables `wait_for_kernels_ready` tracks each admitted session's KernelsReady
condition; a session that stays not ready past `timeout_s` (since admission) or
`recovery_timeout_s` (since it turned not ready while running) is evicted back to PENDING and
requeued after an exponential backoff; past the requeue limits it is deactivated.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from corral.domain.time_limit import MAX_TIME_LIMIT_S

DEFAULT_READY_TIMEOUT_S = 300
DEFAULT_BACKOFF_BASE_S = 60
DEFAULT_BACKOFF_MAX_S = 3600
MAX_BACKOFF_LIMIT_COUNT = 1_000_000


class RequeuingTimestamp(StrEnum):
    """Which time orders requeued sessions of equal priority."""

    EVICTION = "eviction"  # the time of the last eviction (Kueue's default)
    CREATION = "creation"  # the session's creation time


class KernelsReadyReason(StrEnum):
    """Why the KernelsReady condition of a session is what it is."""

    WAIT_FOR_START = "WaitForStart"  # admitted, not every kernel running yet
    READY = "Ready"  # every kernel running (or already ended successfully)
    WAIT_FOR_RECOVERY = "WaitForRecovery"  # running, a kernel stopped being ready
    RECOVERED = "Recovered"  # ready again after WaitForRecovery


# The eviction reason recorded on a session evicted for not becoming ready in time.
KERNELS_READY_TIMEOUT = "KernelsReadyTimeout"


class RequeuingOptions(BaseModel):
    """How an evicted session is requeued, and when it is deactivated instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timestamp: RequeuingTimestamp = RequeuingTimestamp.EVICTION
    # Requeues allowed; the next timeout deactivates (None: requeue forever).
    backoff_limit_count: int | None = Field(default=None, ge=0, le=MAX_BACKOFF_LIMIT_COUNT)
    # Deactivate once a session has kept failing to become ready this long since its first
    # eviction of the cycle (None: no such limit); whichever limit comes first wins.
    backoff_limit_timeout_s: int | None = Field(default=None, ge=1, le=MAX_TIME_LIMIT_S)
    backoff_base_s: int = Field(default=DEFAULT_BACKOFF_BASE_S, ge=0, le=MAX_TIME_LIMIT_S)
    backoff_max_s: int = Field(default=DEFAULT_BACKOFF_MAX_S, ge=0, le=MAX_TIME_LIMIT_S)

    def backoff_s(self, evictions: int) -> int:
        """Seconds before the `evictions`-th eviction's requeue: min(base * 2**(n-1), max).

        The exponent is capped before it is taken (no overflow for large counts) and a base of
        0 is simply no delay.
        """
        if self.backoff_base_s == 0 or self.backoff_max_s == 0:
            return 0
        n = max(evictions, 1) - 1
        # 2**n ≥ max/base as soon as n reaches max's bit length: stop doubling there.
        n = min(n, self.backoff_max_s.bit_length())
        delay: int = min(self.backoff_base_s << n, self.backoff_max_s)
        return delay


class WaitForKernelsReady(BaseModel):
    """A group's all-or-nothing admission options; off unless `enable`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enable: bool = False
    # Seconds from admission (SCHEDULED) to KernelsReady before the session is evicted.
    timeout_s: int = Field(default=DEFAULT_READY_TIMEOUT_S, ge=1, le=MAX_TIME_LIMIT_S)
    # While an admitted session of the group is not ready, place no other (only when enabled).
    block_admission: bool = False
    # Seconds a running session may stay not ready before it is evicted (None: forever).
    recovery_timeout_s: int | None = Field(default=None, ge=1, le=MAX_TIME_LIMIT_S)
    requeuing: RequeuingOptions = RequeuingOptions()
    # Seconds a deactivated session is kept before it is cancelled (None: kept until activated).
    deactivated_retention_s: int | None = Field(default=None, ge=1, le=MAX_TIME_LIMIT_S)

    @property
    def requeues_by_eviction(self) -> bool:
        """Whether evicted sessions take their place in the queue by their last eviction."""
        return self.enable and self.requeuing.timestamp is RequeuingTimestamp.EVICTION

    @property
    def blocks(self) -> bool:
        """Whether admission in the group waits for admitted sessions to be ready."""
        return self.enable and self.block_admission


def requeue_time(
    options: RequeuingOptions, evictions: int, now: datetime, current: datetime | None
) -> datetime:
    """When a session evicted for the `evictions`-th time may be placed again; never earlier
    than a `current` requeue time it already has."""
    due = now + timedelta(seconds=options.backoff_s(evictions))
    return due if current is None or current <= due else current
