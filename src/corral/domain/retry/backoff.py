"""The delay before a retry, exactly as spec document 5's formula, without its known traps.

    base  = retry_delay                                              if backoff is fixed
            min(retry_delay * backoff_multiplier ** retry_count, cap) otherwise
    delay = min(jitter(base), cap)          where cap = min(max_retry_delay or 24 h, 24 h)

What the system it was modelled on got wrong, and how this avoids it (spec README):
- the exponent overflowed at large attempt counts before the cap applied: here the count at
  which the cap is reached is found with a logarithm first, and the power is only computed
  below it (attempt 10,000 costs nothing and overflows nothing);
- a delay of 0 made the jitter step take a modulo by zero: here a zero span adds nothing;
- an uncapped delay overflowed the date arithmetic: every delay is at most 24 h.
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid

from corral.domain.retry.policy import MAX_RETRY_DELAY_S, BackoffStrategy, JitterMode, RetryPolicy

_HASH_SPACE = float(2**160)
# Powers up to e^700 (about 1e304) are finite doubles: below this the power is computed exactly.
_EXACT_GROWTH = 700.0  # SHA1's range: a digest over this is a fraction in [0, 1)


def retry_delay(
    policy: RetryPolicy,
    session_id: uuid.UUID,
    retry_count: int,
    *,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retrying `session_id`, which failed with `retry_count` retries
    behind it (0 for the first attempt). Never negative, never above the cap."""
    cap = min(policy.max_retry_delay or MAX_RETRY_DELAY_S, MAX_RETRY_DELAY_S)
    if policy.backoff is BackoffStrategy.FIXED:
        base = policy.retry_delay
    else:
        base = _exponential(policy.retry_delay, policy.backoff_multiplier, retry_count, cap)
    span = base * policy.jitter_ratio
    if policy.jitter is JitterMode.DETERMINISTIC and span > 0:
        base += span * _fraction(session_id, retry_count)
    elif policy.jitter is JitterMode.RANDOM and span > 0:
        base += span * (rng or random).random()  # [base, base * (1 + ratio))
    return max(0.0, min(base, cap))


def _exponential(delay: float, multiplier: float, count: int, cap: float) -> float:
    """min(delay * multiplier ** count, cap), without computing a power that would overflow.

    Compared in logarithms first: log(delay) + count·log(multiplier) against log(cap). The
    power itself is computed only where it is a finite double (the product is below the cap,
    so it is; the power alone may not be, for a tiny delay).
    """
    if delay <= 0 or count <= 0:
        return min(delay, cap)
    if delay >= cap:
        return cap
    growth = count * math.log(multiplier)
    if math.log(delay) + growth >= math.log(cap):
        return cap
    if abs(growth) < _EXACT_GROWTH:
        return min(delay * multiplier**count, cap)
    return math.exp(math.log(delay) + growth)  # below the cap; 0.0 for a vanishing delay


def _fraction(session_id: uuid.UUID, retry_count: int) -> float:
    """SHA1(session id ∥ retry count) as a fraction in [0, 1): the same for the same inputs.

    The spec's `digest mod (base * ratio)` mapped to a real span: the digest over SHA1's range
    times the span, which is uniform where a modulo by a fractional span is not defined.
    """
    seed = f"{session_id}{retry_count}".encode()  # a UUID's text has a fixed length
    return int.from_bytes(hashlib.sha1(seed, usedforsecurity=False).digest()) / _HASH_SPACE
