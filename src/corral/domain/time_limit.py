"""Wall-time limits: their bounds, Slurm's and the short written forms, and how they are shown."""

from __future__ import annotations

import re

MAX_TIME_LIMIT_S = 366 * 86400  # a year: bounded, so deadlines stay far from any overflow

# Slurm's `--time`: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_SLURM = re.compile(
    r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)"
)
# The short forms: 30s, 90m, 2h, 1d (one number and a unit).
_SHORT = re.compile(r"(?P<n>\d+)(?P<unit>[smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

FORMS = "like 2h, 90m, 30s, 1d, or Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"


def parse_time_limit(text: str) -> int:
    """Seconds for a written limit; ValueError saying the accepted forms otherwise."""
    return parse_duration(text, what="time limit", max_s=MAX_TIME_LIMIT_S)


def parse_duration(text: str, *, what: str, max_s: int) -> int:
    """Seconds for a written duration (`what` it is, for the message) of 1 s to `max_s`;
    ValueError saying the accepted forms otherwise."""
    seconds = _parse(text.strip().lower())
    if seconds is None:
        raise ValueError(f"{what} {text!r} is not a duration; write it {FORMS}")
    if not 1 <= seconds <= max_s:
        raise ValueError(f"{what} {text!r} must be between 1 second and {max_s // 86400} days")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: `2h`, `1h 30m`, `45s`, `3d 4h`."""
    left = max(0, int(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, left = divmod(left, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return " ".join(parts[:2]) or "0s"


def _parse(value: str) -> int | None:
    short = _SHORT.fullmatch(value)
    if short is not None:
        return int(short["n"]) * _UNIT_S[short["unit"]]
    slurm = _SLURM.fullmatch(value)
    if slurm is None:
        return None
    if slurm["days"] is not None:
        days, hours = int(slurm["days"]), int(slurm["dh"])
        minutes, secs = int(slurm["dm"] or 0), int(slurm["ds"] or 0)
        return ((days * 24 + hours) * 60 + minutes) * 60 + secs
    a, b, c = slurm["a"], slurm["b"], slurm["c"]
    if c is not None:  # HH:MM:SS
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM
