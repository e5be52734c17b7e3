"""Checks a pending session must pass before placement looks for room for it.

Each validator returns None (pass) or a Verdict with a stable code: FAIL when the session can
never run as submitted (it fails at once with a message saying what to change, instead of
pending forever), WAIT when it must wait for something of its own (a dependency, its owner's
limits) while the sessions after it go on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from corral.domain.failure_causes import FailureCause
from corral.domain.outcome import DependencyKind, dependency_satisfied
from corral.domain.session import PendingSession
from corral.domain.slots import ResourceSlots
from corral.domain.types import SessionId, UserId
from corral.scheduler.requests import Request, format_milli
from corral.scheduler.types import (
    DependencyState,
    GroupSnapshot,
    Int64Array,
    OwnerAccess,
    OwnerUsage,
    Verdict,
    VerdictKind,
)

DEPENDENCY_MISSING = FailureCause.DEPENDENCY_MISSING
DEPENDENCY_FAILED = FailureCause.DEPENDENCY_FAILED
DEPENDENCY_PENDING = "dependency_pending"
NO_AGENTS = "no_agents"
UNKNOWN_SLOT = FailureCause.UNKNOWN_SLOT
REQUEST_TOO_LARGE = FailureCause.REQUEST_TOO_LARGE
QUOTA_EXCEEDED = FailureCause.QUOTA_EXCEEDED
OWNER_SESSION_LIMIT = "owner_session_limit"
OWNER_SLOT_LIMIT = "owner_slot_limit"
ARRAY_THROTTLE = "array_throttle"
# A group's access rules changed after the session was queued (submission checks them too).
ACCESS_DENIED = "access_denied"
PRIORITY_NOT_ALLOWED = "priority_not_allowed"


@dataclass(slots=True)
class ValidationContext:
    """What the validators read for one resource group during one placement pass."""

    snapshot: GroupSnapshot
    # Live: starts as the snapshot's usage (copied); the planner adds each session it places.
    usage: dict[UserId, OwnerUsage]
    # Every registered agent, usable or not, shape (agents, slots): what the group could ever hold.
    capacity: Int64Array
    # max_slots_per_owner in milli-units (None: no limit).
    owner_slot_limit: dict[str, int] | None
    # Live: per throttled job array, its elements holding resources (placed in this pass too).
    array_active: dict[SessionId, int] = field(default_factory=dict)
    # "could ever fit" per distinct request: sessions of one group often ask for the same.
    _fits: dict[tuple[bool, int, bytes], bool] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def build(cls, snapshot: GroupSnapshot) -> ValidationContext:
        """Derive the context from `snapshot`; later changes to `usage` leave the snapshot as is."""
        limit = snapshot.options.max_slots_per_owner
        return cls(
            snapshot=snapshot,
            usage={
                owner: OwnerUsage(u.sessions, dict(u.slots)) for owner, u in snapshot.usage.items()
            },
            capacity=snapshot.agents.capacity,
            owner_slot_limit=None if limit is None else limit.to_milli(),
            array_active=dict(snapshot.array_active),
        )

    @property
    def group(self) -> str:
        return self.snapshot.group

    def add_placed(self, session: PendingSession, request: Request) -> None:
        """Count a session placed in this pass against its owner's (and array's) live usage.

        The slot tally is only kept when a slot limit applies: nothing else reads it.
        """
        if session.array_throttle is not None and session.array_id is not None:
            self.array_active[session.array_id] = self.array_active.get(session.array_id, 0) + 1
        usage = self.usage.setdefault(session.owner_id, OwnerUsage())
        usage.sessions += 1
        if self.owner_slot_limit is not None:
            for name, amount in self.request_slots(request).items():
                usage.slots[name] = usage.slots.get(name, 0) + amount

    def request_slots(self, request: Request) -> dict[str, int]:
        """The request's total by slot name (known slots with a non-zero amount)."""
        names = self.snapshot.agents.slot_names
        total = request.total
        return {names[i]: int(total[i]) for i in np.flatnonzero(total)}


Validator = Callable[[PendingSession, Request, ValidationContext], Verdict | None]


def validate(session: PendingSession, request: Request, ctx: ValidationContext) -> Verdict | None:
    """Run every validator in order; the first verdict wins; None: it may be placed."""
    for validator in VALIDATORS:
        verdict = validator(session, request, ctx)
        if verdict is not None:
            return verdict
    return None


def check_access(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """The group's access rules, as they are now: a session queued before its owner was taken
    off the group's users, or before its max_user_priority fell below the session's priority,
    waits (it is not failed: the rule may change back, and its owner sees why in its reason).
    """
    options = ctx.snapshot.options
    if options.allowed_users is None and session.priority <= options.max_user_priority:
        return None
    owner = ctx.snapshot.owners.get(session.owner_id) or OwnerAccess(str(session.owner_id), False)
    refused = options.access_refusal(ctx.group, owner.name, owner.is_admin)
    if refused is not None:
        return _wait(
            ACCESS_DENIED,
            f"{refused}; it waits until an admin opens the group to its owner, "
            "or until it is cancelled",
        )
    refused = options.priority_refusal(ctx.group, session.priority, owner.is_admin)
    if refused is not None:
        return _wait(
            PRIORITY_NOT_ALLOWED,
            f"{refused}; it waits until an admin raises max_user_priority, or until it is "
            f"cancelled (submit it again at priority {options.max_user_priority} or less)",
        )
    return None


def check_dependencies(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """Each dependency as its kind says: afterok needs a success, afterany any end, afternotok
    an end that was no success; one that can never be satisfied fails the session."""
    waiting: list[DependencyState] = []
    for dependency in ctx.snapshot.dependencies.get(session.id, ()):
        ref = _short(dependency)
        if dependency.status is None:
            return _fail(
                DEPENDENCY_MISSING,
                f"depends on session {ref}, which does not exist; "
                "submit it again without that dependency",
            )
        satisfied = dependency_satisfied(dependency.kind, dependency.status, dependency.result)
        if satisfied is None:
            waiting.append(dependency)
        elif not satisfied:
            return _fail(
                DEPENDENCY_FAILED,
                f"depends on session {ref} ({dependency.kind}) which ended {_ending(dependency)}, "
                f"so it can never run; {_NEVER[dependency.kind]}",
            )
    if not waiting:
        return None
    first = waiting[0]
    more = f" and {len(waiting) - 1} more" if len(waiting) > 1 else ""
    return _wait(
        DEPENDENCY_PENDING,
        f"waiting for session {_short(first)} ({first.kind}){more} to end; it is {first.status}",
    )


# What to do about a dependency that can never be satisfied, by kind.
_NEVER = {
    DependencyKind.AFTEROK: "fix that session and submit both again",
    DependencyKind.AFTERNOTOK: "it succeeded, so nothing is left to handle",
    DependencyKind.AFTERANY: "",  # any end satisfies it
}


def check_agents_joined(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """A group no agent has joined yet cannot judge any request: wait for agents."""
    if ctx.snapshot.agents.ids:
        return None
    return _wait(
        NO_AGENTS,
        f"no agent has joined resource group {ctx.group!r} yet; "
        "the session starts once an agent registers in it",
    )


def check_known_slots(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """Every requested slot must be one some agent of the group offers."""
    if not request.unknown_slots:
        return None
    offered = ", ".join(ctx.snapshot.agents.slot_names) or "no slots at all"
    return _fail(
        UNKNOWN_SLOT,
        f"requests {', '.join(request.unknown_slots)}, which no agent in resource group "
        f"{ctx.group!r} has (it has: {offered}); remove it or choose another resource group",
    )


def check_could_ever_fit(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """The request must fit the group's registered agents when all of them are empty.

    Multi-node kernels may share agents, so each agent holds as many kernels as fit in it. The
    per-kernel bound is the slot-wise maximum over the session's kernels: when kernels differ,
    this can reject a mix a cleverer packing would fit, but it never accepts one that cannot.
    """
    if not ctx.snapshot.agents.ids:
        return None  # nothing to judge against yet: check_agents_joined makes it wait
    key = (request.multi_node, request.kernels, request.per_kernel.tobytes())
    fits = ctx._fits.get(key)
    if fits is None:
        fits = _could_ever_fit(request, ctx.capacity)
        ctx._fits[key] = fits
    if fits:
        return None
    if not request.multi_node:
        return _fail(
            REQUEST_TOO_LARGE,
            f"needs {format_milli(ctx.request_slots(request))} on one agent, but the largest "
            f"agent in resource group {ctx.group!r} has {_closest_agent(request.total, ctx)}; "
            "ask for less, use multi-node mode, or add a larger agent",
        )
    bound = _kernel_bound(request)
    names = ctx.snapshot.agents.slot_names
    kernel_text = format_milli({names[i]: int(v) for i, v in enumerate(bound)})
    held = _copies(bound, ctx.capacity, request.kernels).sum()
    return _fail(
        REQUEST_TOO_LARGE,
        f"needs {request.kernels} kernels of {kernel_text}, but the "
        f"{len(ctx.snapshot.agents.ids)} agent(s) in resource group {ctx.group!r} could hold "
        f"at most {held} of them even sharing agents "
        f"(largest agent: {_closest_agent(bound, ctx)}); ask for fewer or smaller kernels, "
        "or add agents",
    )


def check_owner_limits(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """The owner's per-group limits: a session over the slot limit alone fails, else it waits."""
    options = ctx.snapshot.options
    limit = ctx.owner_slot_limit
    if limit is None and options.max_sessions_per_owner is None:
        return None
    total = ctx.request_slots(request)
    if limit is not None:
        over = [name for name, cap in limit.items() if total.get(name, 0) > cap]
        if over:
            return _fail(
                QUOTA_EXCEEDED,
                f"needs {_pick(total, over)} but the per-owner limit in resource group "
                f"{ctx.group!r} is {_pick(limit, over)}; ask for at most that much",
            )
    usage = ctx.usage.get(session.owner_id, OwnerUsage())
    max_sessions = options.max_sessions_per_owner
    if max_sessions is not None and usage.sessions + 1 > max_sessions:
        return _wait(
            OWNER_SESSION_LIMIT,
            f"its owner already has {usage.sessions} session(s) holding resources in resource "
            f"group {ctx.group!r}, the per-owner limit of {max_sessions}; "
            "it starts when one of them ends",
        )
    if limit is not None:
        over = [
            name
            for name, cap in limit.items()
            if usage.slots.get(name, 0) + total.get(name, 0) > cap
        ]
        if over:
            return _wait(
                OWNER_SLOT_LIMIT,
                f"its owner holds {_pick(usage.slots, over)} in resource group "
                f"{ctx.group!r}; adding {_pick(total, over)} would pass the per-owner limit "
                f"of {_pick(limit, over)}; it starts when the owner's other sessions free enough",
            )
    return None


def check_array_throttle(
    session: PendingSession, request: Request, ctx: ValidationContext
) -> Verdict | None:
    """A throttled job array's element waits while the array has its cap of elements active.

    Session-specific (WAIT): the rest of the queue goes on past it.
    """
    throttle = session.array_throttle
    if throttle is None or session.array_id is None:
        return None
    active = ctx.array_active.get(session.array_id, 0)
    if active < throttle:
        return None
    return _wait(
        ARRAY_THROTTLE,
        f"array throttle {throttle} reached: {active} elements of array "
        f"{str(session.array_id)[:8]} are active; it starts when one of them ends",
    )


VALIDATORS: tuple[Validator, ...] = (
    check_access,
    check_dependencies,
    check_agents_joined,
    check_known_slots,
    check_could_ever_fit,
    check_array_throttle,
    check_owner_limits,
)


def _could_ever_fit(request: Request, capacity: Int64Array) -> bool:
    if capacity.shape[0] == 0:
        return False
    if not request.multi_node:
        return bool(np.all(capacity >= request.total, axis=1).any())
    return int(_copies(_kernel_bound(request), capacity, request.kernels).sum()) >= request.kernels


def _kernel_bound(request: Request) -> Int64Array:
    """The slot-wise largest per-kernel request: a bound every kernel of the session fits in."""
    if request.kernels == 0:
        return np.zeros(request.per_kernel.shape[1], dtype=np.int64)
    bound: Int64Array = request.per_kernel.max(axis=0)
    return bound


def _copies(bound: Int64Array, capacity: Int64Array, kernels: int) -> Int64Array:
    """How many kernels of size `bound` each agent holds when empty, counted up to `kernels`
    (a session needs no more, and the counts of many agents then add up without overflow)."""
    needed = bound > 0
    if not needed.any():
        return np.full(capacity.shape[0], kernels, dtype=np.int64)
    copies: Int64Array = np.minimum((capacity[:, needed] // bound[needed]).min(axis=1), kernels)
    return copies


def _closest_agent(need: Int64Array, ctx: ValidationContext) -> str:
    """The capacity, over the needed slots, of the agent covering the largest part of `need`."""
    capacity = ctx.capacity
    needed = np.flatnonzero(need > 0)
    cover = np.minimum(capacity[:, needed] / need[needed], 1.0).sum(axis=1)
    best = int(np.argmax(cover))  # first of equals: the agent listed first
    names = ctx.snapshot.agents.slot_names
    return _pick({names[i]: int(capacity[best, i]) for i in needed}, [names[i] for i in needed])


def _pick(amounts: Mapping[str, int], names: list[str]) -> str:
    """`cpu=2 mem=4GiB` for `names` only, in the usual slot order; `name=0` where there is none."""
    nonzero = {name: amounts.get(name, 0) for name in names if amounts.get(name, 0)}
    ordered = list(ResourceSlots.from_milli(nonzero)) if nonzero else []
    missing = [name for name in names if name not in nonzero]
    parts = [format_milli({name: nonzero[name]}) for name in ordered]
    return " ".join([*parts, *(f"{name}=0" for name in sorted(missing))])


def _ending(dependency: DependencyState) -> str:
    return f"{dependency.status} with result {dependency.result or 'none'}"


def _short(dependency: DependencyState) -> str:
    """The dependency as users name it: its number, else (no such session) its id's start."""
    if dependency.number is not None:
        return str(dependency.number)
    return str(dependency.session_id)[:8]


def _fail(code: str, message: str) -> Verdict:
    return Verdict(VerdictKind.FAIL, code, message)


def _wait(code: str, message: str) -> Verdict:
    return Verdict(VerdictKind.WAIT, code, message)
