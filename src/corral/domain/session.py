"""Sessions and kernels as the coordinator and scheduler see them (read from the store)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum

from corral.domain.outcome import DependencyKind
from corral.domain.record import record
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, KernelId, SessionId, UserId

# Resource amounts in milli-units (1 cpu = 1000; 1 byte = 1000), as the store keeps them.
MilliSlots = Mapping[str, int]


class KernelIntent(StrEnum):
    """What the manager wants an agent to do with a kernel: its desired state.

    Handlers write it (with a generation bumped on every request) and bump the agent's
    assignment revision; the agent reads it from its assignments and reconciles.
    """

    PREPARE = "PREPARE"  # fetch the image/environment, make the kernel ready to start
    RUN = "RUN"  # start the prepared kernel
    STOP = "STOP"  # stop it (if running) and report how it ended


@record
class KernelRecord:
    """One kernel of a session."""

    id: KernelId
    session_id: SessionId
    cluster_role: str
    cluster_index: int
    agent_id: AgentId | None
    status: KernelStatus
    status_changed_at: datetime
    requested_slots: MilliSlots
    occupied_slots: MilliSlots | None
    exit_code: int | None
    failure_cause: str | None
    desired_state: KernelIntent | None = None
    desired_generation: int = 0
    # The agent's last attempt at the current stage failed with this cause (it may be retried).
    stage_failure: str | None = None


@record
class KernelState:
    """A kernel as the promotions see it: where it stands and how it ended."""

    cluster_role: str
    cluster_index: int
    status: KernelStatus
    exit_code: int | None = None
    failure_cause: str | None = None
    # The manager asked its agent to stop it (`KernelIntent.STOP`): its end was not its own.
    stopped: bool = False


@record
class SessionProgress:
    """A session as the promotions see it: its status, whether it ran, its kernels."""

    id: SessionId
    status: SessionStatus
    started_at: datetime | None
    kernels: tuple[KernelState, ...]
    # The failure cause it carries: set when its end was asked for (`outcome.REQUESTED_RESULTS`).
    cause: str | None = None


@record
class SessionWithKernels:
    """A session row with its kernels, the unit every handler works on."""

    id: SessionId
    name: str | None
    owner_id: UserId
    type: str
    priority: int
    resource_group: str
    cluster_mode: str
    cluster_size: int
    status: SessionStatus
    status_info: str | None
    status_changed_at: datetime
    created_at: datetime
    starts_at: datetime | None
    requeue_at: datetime | None
    requeue_active: bool
    phase: str | None
    phase_attempts: int
    failed_agents: tuple[AgentId, ...]
    creation_id: str | None
    kernels: tuple[KernelRecord, ...]
    started_at: datetime | None = None
    # A job array's element: the array, and how many of its elements may be active at once.
    array_id: SessionId | None = None
    array_throttle: int | None = None
    evicted_at: datetime | None = None  # all-or-nothing admission's last eviction

    def requested_total(self) -> dict[str, int]:
        """The sum of all kernels' requested slots (milli-units)."""
        total: dict[str, int] = {}
        for kernel in self.kernels:
            for name, amount in kernel.requested_slots.items():
                total[name] = total.get(name, 0) + amount
        return total


@record
class PendingSession:
    """A PENDING session as placement sees it: who asks, how urgently, and each kernel's request.

    Kernels are named by their cluster index (`kernel_slots[i]` is kernel i's request): a
    placement is written to the kernel rows by (session, index), so a scheduling pass reads one
    row per session, not one per kernel.
    """

    id: SessionId
    name: str | None
    owner_id: UserId
    priority: int
    resource_group: str
    cluster_mode: str
    status: SessionStatus
    created_at: datetime
    starts_at: datetime | None
    requeue_at: datetime | None
    requeue_active: bool
    failed_agents: tuple[AgentId, ...]
    kernel_slots: tuple[MilliSlots, ...]
    # A throttled job array's element: the array and its cap (None: no cap applies).
    array_id: SessionId | None = None
    array_throttle: int | None = None
    # When all-or-nothing admission last evicted it (None: never): a group that requeues by
    # eviction time orders it by this instead of its creation (`sequencers.order_sessions`).
    evicted_at: datetime | None = None

    @property
    def cluster_size(self) -> int:
        return len(self.kernel_slots)

    def requested_total(self) -> dict[str, int]:
        """The sum of all kernels' requested slots (milli-units)."""
        total: dict[str, int] = {}
        for slots in self.kernel_slots:
            for name, amount in slots.items():
                total[name] = total.get(name, 0) + amount
        return total

    @classmethod
    def of(cls, session: SessionWithKernels) -> PendingSession:
        """The placement view of a session loaded with its kernels."""
        return cls(
            id=session.id,
            name=session.name,
            owner_id=session.owner_id,
            priority=session.priority,
            resource_group=session.resource_group,
            cluster_mode=session.cluster_mode,
            status=session.status,
            created_at=session.created_at,
            starts_at=session.starts_at,
            requeue_at=session.requeue_at,
            requeue_active=session.requeue_active,
            failed_agents=session.failed_agents,
            kernel_slots=tuple(
                k.requested_slots for k in sorted(session.kernels, key=_cluster_index)
            ),
            array_id=session.array_id,
            array_throttle=session.array_throttle,
            evicted_at=session.evicted_at,
        )


def _cluster_index(kernel: KernelRecord) -> int:
    return kernel.cluster_index


@record
class NewSession:
    """What the store needs to create a session and its `cluster_size` kernels, all PENDING."""

    id: SessionId
    owner_id: UserId
    type: str
    resource_group: str
    cluster_mode: str
    cluster_size: int
    spec: Mapping[str, object]
    kernel_slots: MilliSlots
    name: str | None = None
    priority: int = 0
    project: str = "default"
    creation_id: str | None = None
    # What the request under `creation_id` was (`domain.idempotency`); None without a key.
    creation_fingerprint: Mapping[str, str] | None = None
    starts_at: datetime | None = None
    # (session, kind): the sessions it waits for, and when it may start after each.
    dependencies: tuple[tuple[uuid.UUID, DependencyKind], ...] = ()
    # Whole job arrays (by id) it waits for: made dependencies on each element on submission.
    array_dependencies: tuple[tuple[uuid.UUID, DependencyKind], ...] = ()
    time_limit_s: int | None = None
    array: ArrayPlace | None = None
    # Retry (spec document 5): the effective policy (JSON) and its max_retries; a retry's
    # parent, its place in the chain and the cause it retries.
    max_retries: int = 0
    retry_policy: Mapping[str, object] | None = None
    parent_session_id: SessionId | None = None
    retry_count: int = 0
    retry_cause: str | None = None


@record
class ArrayPlace:
    """A session's place in a job array: the array (its first element's id), its index, and
    how many of the array's elements may hold resources at once (None: no cap)."""

    array_id: SessionId
    index: int
    throttle: int | None = None
