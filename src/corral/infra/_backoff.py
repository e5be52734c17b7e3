"""Delays between reconnect attempts, shared by every listener that talks to a server."""

from __future__ import annotations

import random
from collections.abc import Iterator


def reconnect_delays(base_s: float, cap_s: float) -> Iterator[float]:
    """Doubling delays from `base_s` up to `cap_s`, each jittered to 50-100 % (never ends).

    The jitter keeps many managers that lost the same server from reconnecting in lockstep.
    """
    delay_s = base_s
    while True:
        yield delay_s * random.uniform(0.5, 1.0)
        delay_s = min(delay_s * 2, cap_s)
