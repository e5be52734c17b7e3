"""The hint names: which coordinator task a hint wakes."""

from __future__ import annotations

from enum import StrEnum


class Hint(StrEnum):
    """A hint per task of the session coordinator; setting one only wakes the task early."""

    SCHEDULE = "schedule"
    TERMINATE = "terminate"
