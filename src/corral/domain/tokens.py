"""How long users' API tokens last: the default, the bound, the expiry of a new one."""

from __future__ import annotations

from datetime import datetime, timedelta

# How long a user's token lasts when whoever makes it names no expiry: the manager's
# `token_ttl_days` setting (0: for ever).
DEFAULT_TOKEN_TTL_DAYS = 90.0
DEFAULT_TOKEN_TTL_S = DEFAULT_TOKEN_TTL_DAYS * 86_400
# Ten years: the longest a token may be made to last, far from datetime's limits.
MAX_TOKEN_LIFETIME_S = 10 * 365 * 86_400


def token_expiry(now: datetime, lifetime_s: float | None) -> datetime | None:
    """When a token made `now` to last `lifetime_s` expires (None: never)."""
    return None if lifetime_s is None else now + timedelta(seconds=lifetime_s)
