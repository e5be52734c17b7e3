"""Per-resource-group scheduling options, stored as JSON on the group's row."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from corral.domain.admission import WaitForKernelsReady
from corral.domain.retry.policy import RetryPolicy
from corral.domain.slots import ResourceSlots
from corral.domain.spec import MAX_PRIORITY, MIN_PRIORITY
from corral.domain.time_limit import MAX_TIME_LIMIT_S, format_duration
from corral.domain.types import USER_NAME_PATTERN


class Sequencer(StrEnum):
    """How sessions of equal priority are ordered."""

    FIFO = "fifo"  # oldest first
    LIFO = "lifo"  # newest first
    DRF = "drf"  # owner with the lowest dominant share of the group's capacity first


class Selector(StrEnum):
    """Which agent a kernel goes to among those that fit."""

    CONCENTRATED = "concentrated"  # pack: the agent left with the least free capacity
    DISPERSED = "dispersed"  # spread: the agent left with the most free capacity
    ROUNDROBIN = "roundrobin"  # the next agent in turn


class Ordering(StrEnum):
    """What a session that does not fit for lack of resources does to the ones after it."""

    STRICT = "strict"  # they wait behind it (no starvation of large sessions)
    BEST_EFFORT = "best_effort"  # smaller ones may pass it


MAX_PHASE_ATTEMPTS = 1000
MAX_SESSIONS_PER_OWNER = 2**31 - 1
# The lifecycle handlers whose attempts and time a group may limit (their names are the phases).
LIMITED_PHASES = ("ScheduleNewSessions", "PrepareSessions", "StartSessions", "TerminateSessions")

# The highest priority a plain user may give a session in a group that sets none: users may
# lower their sessions' priority (Slurm's `--nice`), raising it above 0 needs an admin.
DEFAULT_MAX_USER_PRIORITY = 0
# Users a group may list as the only ones allowed in it.
MAX_ALLOWED_USERS = 1000

UserName = Annotated[str, StringConstraints(pattern=USER_NAME_PATTERN)]


class PhaseLimitOptions(BaseModel):
    """A group's override of one handler's limits; a field left out keeps the default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int | None = Field(default=None, ge=1, le=MAX_PHASE_ATTEMPTS)
    # Bounded like a time limit: a phase's deadline is a time the loops compute and compare.
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)


class ResourceGroupOptions(BaseModel):
    """The scheduling options of one resource group; every field has a safe default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sequencer: Sequencer = Sequencer.FIFO
    selector: Selector = Selector.CONCENTRATED
    ordering: Ordering = Ordering.STRICT
    # Sessions one owner may hold resources with at once in this group (None: no limit).
    max_sessions_per_owner: int | None = Field(default=None, ge=1, le=MAX_SESSIONS_PER_OWNER)
    # Total slots one owner may occupy at once in this group (None: no limit).
    max_slots_per_owner: ResourceSlots | None = None
    # Wall-time limits (seconds): a session that gives none gets the default (else the
    # maximum); one asking for more than the maximum is refused at submission.
    default_time_limit_s: int | None = Field(default=None, ge=1, le=MAX_TIME_LIMIT_S)
    max_time_limit_s: int | None = Field(default=None, ge=1, le=MAX_TIME_LIMIT_S)

    # Per lifecycle handler (by name): failed attempts before giving up, seconds before expiry.
    # E.g. {"ScheduleNewSessions": {"timeout_s": 3600}} cancels sessions pending over an hour.
    phase_limits: dict[str, PhaseLimitOptions] = {}
    # The group's default retry policy (spec document 5): the fields given here win over the
    # cluster default, a session's own over these. E.g. {"max_retries": 2}.
    retry_policy: RetryPolicy | None = None

    # Who may submit here: None (the default) is everyone; else only these users, by name
    # (admins always may). Queued sessions of a user taken off the list wait (`access_denied`).
    allowed_users: tuple[UserName, ...] | None = Field(default=None, max_length=MAX_ALLOWED_USERS)
    # The highest priority a plain user may give a session here; above it needs an admin.
    max_user_priority: int = Field(
        default=DEFAULT_MAX_USER_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY
    )
    # All-or-nothing admission (spec document 2): off by default.
    wait_for_kernels_ready: WaitForKernelsReady = WaitForKernelsReady()

    @field_validator("allowed_users")
    @classmethod
    def _sorted_users(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else tuple(sorted(set(value)))

    def access_refusal(self, group: str, user: str, is_admin: bool) -> str | None:
        """Why `user` may not use this group (`group` is its name), or None when they may."""
        if is_admin or self.allowed_users is None or user in self.allowed_users:
            return None
        return (
            f"resource group {group!r} is open to listed users only, and {user!r} is not "
            "one of them"
        )

    def priority_refusal(self, group: str, priority: int, is_admin: bool) -> str | None:
        """Why a session of `priority` needs an admin in this group, or None when it does not."""
        if is_admin or priority <= self.max_user_priority:
            return None
        return (
            f"priority {priority} is above {self.max_user_priority}, the max_user_priority of "
            f"resource group {group!r}: only admins may submit above it"
        )

    @field_validator("phase_limits")
    @classmethod
    def _known_phases(cls, value: dict[str, PhaseLimitOptions]) -> dict[str, PhaseLimitOptions]:
        unknown = sorted(set(value) - set(LIMITED_PHASES))
        if unknown:
            raise ValueError(
                f"unknown phase {', '.join(unknown)}; use one of {', '.join(LIMITED_PHASES)}"
            )
        return value

    @model_validator(mode="after")
    def _default_within_max(self) -> ResourceGroupOptions:
        default, most = self.default_time_limit_s, self.max_time_limit_s
        if default is not None and most is not None and default > most:
            raise ValueError(
                f"default_time_limit_s ({format_duration(default)}) must not exceed "
                f"max_time_limit_s ({format_duration(most)})"
            )
        return self

    def time_limit_for(self, asked: int | None) -> int | None:
        """The limit a session asking for `asked` gets here (None: none); see `check_time_limit`."""
        if asked is not None:
            return asked
        return self.default_time_limit_s or self.max_time_limit_s

    def check_time_limit(self, asked: int | None) -> str | None:
        """Why `asked` is refused here (over the group's maximum), or None."""
        most = self.max_time_limit_s
        if asked is None or most is None or asked <= most:
            return None
        return (
            f"time limit {format_duration(asked)} is over the maximum of "
            f"{format_duration(most)} in this resource group; ask for at most that"
        )

    @field_validator("max_slots_per_owner")
    @classmethod
    def _storable(cls, value: ResourceSlots | None) -> ResourceSlots | None:
        if value is not None:
            value.to_milli()
        return value
