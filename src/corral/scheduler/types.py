"""What placement works on and what it decides: the snapshot, the verdicts, the plan."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from corral.domain.outcome import DEFAULT_DEPENDENCY_KIND, DependencyKind
from corral.domain.record import record
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.session import PendingSession, SessionWithKernels
from corral.domain.status import SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.store.placements import SessionPlacement
from corral.store.scheduling import QueuePlace

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@record
class QueuePage:
    """Which part of a group's queue a pass reads: up to `size` sessions, in queue order,
    after the session at `after` (from the head when None). `number` counts the pass's pages
    read before this one: the least a page holds grows with it (`load_snapshot`)."""

    size: int
    after: QueuePlace | None = None
    number: int = 0


@dataclass(slots=True)
class AgentPool:
    """The agents of one resource group as arrays: one row per agent, one column per slot.

    Amounts are milli-units. `capacity` covers every registered agent (to judge what the group
    could *ever* hold); only rows with `usable` set (ALIVE and schedulable) take placements.
    """

    ids: list[AgentId]
    slot_names: list[str]
    capacity: Int64Array  # shape (agents, slots)
    free: Int64Array  # shape (agents, slots): capacity minus occupied
    usable: BoolArray  # shape (agents,)

    @property
    def slot_index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.slot_names)}

    def free_in_total(self) -> dict[str, int]:
        """Per slot name, what the usable agents have free together."""
        # Python integers: agents' amounts each fit 64 bits, their sum over a group need not.
        totals = self.free[self.usable].sum(axis=0, dtype=object)
        return {name: int(totals[i]) for i, name in enumerate(self.slot_names)}

    @classmethod
    def empty(cls) -> AgentPool:
        return cls(
            [], [], np.zeros((0, 0), np.int64), np.zeros((0, 0), np.int64), np.zeros(0, bool)
        )


@dataclass(slots=True)
class OwnerUsage:
    """What one owner holds in the group now: sessions occupying resources, and their slots."""

    sessions: int = 0
    slots: dict[str, int] = field(default_factory=dict)


@record
class OwnerAccess:
    """Who owns a session, as a group's access rules judge them."""

    name: str
    is_admin: bool


@record
class DependencyState:
    """Where a session's dependency stands."""

    session_id: uuid.UUID
    status: SessionStatus | None  # None: no such session
    result: str | None
    kind: DependencyKind = DEFAULT_DEPENDENCY_KIND
    number: int | None = None  # the session's short number (None: no such session)


@dataclass(slots=True)
class GroupSnapshot:
    """Everything placement needs for one resource group, read in one transaction."""

    group: str
    options: ResourceGroupOptions
    pending: list[PendingSession]  # candidates only: due, active, PENDING
    agents: AgentPool
    usage: dict[UserId, OwnerUsage]
    dependencies: dict[SessionId, list[DependencyState]]
    now: datetime
    # Read for a page of the queue (`QueuePage`): the sessions read, with their kernels (the
    # whole queue for a group that is not read in pages, `snapshot.pages_queue`), and whether
    # the queue may go on after the last of them.
    read: list[SessionWithKernels] = field(default_factory=list)
    more_queued: bool = False
    # Per throttled job array among the candidates: how many of its elements hold resources.
    array_active: dict[SessionId, int] = field(default_factory=dict)
    # The owners the group's access rules must judge (`snapshot.owners_to_judge`): all of the
    # candidates' when the group lists its users, else those asking above max_user_priority.
    owners: dict[UserId, OwnerAccess] = field(default_factory=dict)
    # All-or-nothing admission with `block_admission` (spec document 2): the number of an
    # admitted session of the group whose kernels are not all ready; nothing is placed then.
    admission_blocker: int | None = None


class VerdictKind(StrEnum):
    """What a validator or the planner concluded for one session in this pass."""

    FAIL = "fail"  # permanent: the session can never run as submitted
    WAIT = "wait"  # session-specific: it waits, the sessions after it go on
    SHORTAGE = "shortage"  # no room now: under strict ordering, later sessions wait behind it


@record
class Verdict:
    """A reason a session is not placed in this pass: a stable code and a readable message."""

    kind: VerdictKind
    code: str
    message: str


class Outcome(StrEnum):
    """The decision for one session in one pass."""

    PLACED = "placed"
    FAILED = "failed"  # permanent
    WAITING = "waiting"  # its own reason (dependency, owner limit, no room)
    BLOCKED = "blocked"  # waiting behind a session earlier in the order


@record
class Decision:
    """What placement decided for one session, with its place in the group's order (1-based)."""

    session_id: SessionId
    outcome: Outcome
    position: int
    code: str = ""
    message: str = ""


@dataclass(slots=True)
class Plan:
    """The result of placement: what to commit, and a decision for every candidate."""

    placements: list[SessionPlacement] = field(default_factory=list)
    decisions: dict[SessionId, Decision] = field(default_factory=dict)
    order: list[SessionId] = field(default_factory=list)
    # Under strict ordering, the first session that did not fit for lack of capacity: every
    # session after it in `order` waits behind it (None when nothing blocked the queue).
    blocker: SessionId | None = None
    # Sessions whose stored request placement cannot work with, and why: set aside (neither
    # ordered nor decided), to be isolated (`coordination.quarantine`).
    invalid: dict[SessionId, str] = field(default_factory=dict)
