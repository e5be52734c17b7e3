"""A point in time as users write it: an age (`10m`, `2h`, `1d`) or an ISO 8601 time."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_AGE = re.compile(r"(?P<amount>\d+(?:\.\d+)?)(?P<unit>s|m|h|d)")
_UNIT_S = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_moment(text: str, now: datetime) -> datetime:
    """`10m` (that long before `now`) or an ISO 8601 time (UTC unless it names a zone).

    Raises ValueError saying what is accepted.
    """
    text = text.strip()
    age = _AGE.fullmatch(text)
    if age is not None:
        seconds = float(age["amount"]) * _UNIT_S[age["unit"]]
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            return datetime.min.replace(tzinfo=UTC)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an age like 30s, 10m, 2h or 1d nor an ISO 8601 time "
            "like 2030-01-01T09:00:00Z"
        ) from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{text!r} is out of the range of times") from None
