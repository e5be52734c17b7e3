"""Small builders of scheduler inputs for unit tests: sessions, agent pools, snapshots.

Amounts are milli-units, as the store keeps them (1 cpu = 1000, 1 byte = 1000). Owners and
ids may be given as small ints (`owner=1`) for readable tests; `created` is seconds after T0.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from corral.domain.outcome import DependencyKind
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.session import PendingSession
from corral.domain.spec import MAX_PRIORITY
from corral.domain.status import SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.scheduler.types import (
    AgentPool,
    DependencyState,
    GroupSnapshot,
    Int64Array,
    OwnerAccess,
    OwnerUsage,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
# A group whose users may give any priority (the default lets only admins go above 0).
ANY_PRIORITY = ResourceGroupOptions(max_user_priority=MAX_PRIORITY)
CPU = 1000  # one cpu in milli-units
GIB = 1024**3 * 1000  # one GiB of memory in milli-units


def user(n: int | UserId) -> UserId:
    """A readable owner id: `user(1)` is always the same UUID."""
    return n if isinstance(n, uuid.UUID) else UserId(uuid.UUID(int=n))


def session_id(n: int | SessionId | None = None) -> SessionId:
    """A session id: `session_id(7)` is always the same UUID; no argument gives a fresh one."""
    if n is None:
        return SessionId(uuid.uuid4())
    return n if isinstance(n, uuid.UUID) else SessionId(uuid.UUID(int=n))


def at(created: float | datetime) -> datetime:
    """`created` as a datetime: a number means seconds after T0."""
    return created if isinstance(created, datetime) else T0 + timedelta(seconds=created)


def session(
    *,
    id: int | SessionId | None = None,
    owner: int | UserId = 1,
    priority: int = 0,
    created: float | datetime = 0,
    kernels: int = 1,
    slots: Mapping[str, int] | None = None,
    per_kernel: Sequence[Mapping[str, int]] | None = None,
    mode: str = "single-node",
    failed_agents: Iterable[str] = (),
    status: SessionStatus = SessionStatus.PENDING,
    group: str = "default",
    name: str | None = None,
    array: tuple[int | SessionId, int] | None = None,
) -> PendingSession:
    """A session of `kernels` kernels, each requesting `slots` (default one cpu).

    `per_kernel` gives each kernel its own request instead (and sets the kernel count).
    `array`: (array id, throttle) of a throttled job array's element.
    """
    requests = (
        list(per_kernel)
        if per_kernel is not None
        else [slots if slots is not None else {"cpu": CPU}] * kernels
    )
    return PendingSession(
        id=session_id(id),
        name=name,
        owner_id=user(owner),
        priority=priority,
        resource_group=group,
        cluster_mode=mode,
        status=status,
        created_at=at(created),
        starts_at=None,
        requeue_at=None,
        requeue_active=True,
        failed_agents=tuple(AgentId(a) for a in failed_agents),
        kernel_slots=tuple(dict(request) for request in requests),
        array_id=None if array is None else session_id(array[0]),
        array_throttle=None if array is None else array[1],
    )


def pool(
    agents: Mapping[str, Mapping[str, int]],
    *,
    occupied: Mapping[str, Mapping[str, int]] | None = None,
    usable: Iterable[str] | None = None,
) -> AgentPool:
    """Agents in the given order with `agents[id]` capacity; slot columns sorted by name.

    `occupied` is what each agent already holds (default nothing); `usable` names the agents
    that take placements (default all of them).
    """
    occupied = occupied or {}
    names = sorted({name for slots in (*agents.values(), *occupied.values()) for name in slots})
    ids = list(agents)
    capacity = _matrix([agents[a] for a in ids], names)
    held = _matrix([occupied.get(a, {}) for a in ids], names)
    usable_ids = set(ids if usable is None else usable)
    return AgentPool(
        ids=[AgentId(a) for a in ids],
        slot_names=names,
        capacity=capacity,
        free=capacity - held,
        usable=np.array([a in usable_ids for a in ids], dtype=np.bool_),
    )


def cpu_pool(
    free: Mapping[str, int], *, capacity: int = 8, usable: Iterable[str] | None = None
) -> AgentPool:
    """Agents of `capacity` cpus each, in the given order, with `free[id]` whole cpus free."""
    return pool(
        {a: {"cpu": capacity * CPU} for a in free},
        occupied={a: {"cpu": (capacity - n) * CPU} for a, n in free.items()},
        usable=usable,
    )


def usage(sessions: int = 0, slots: Mapping[str, int] | None = None) -> OwnerUsage:
    """What an owner holds now: `usage(2, {"cpu": 4 * CPU})`."""
    return OwnerUsage(sessions=sessions, slots=dict(slots or {}))


def dependency(
    n: int | SessionId,
    status: SessionStatus | None,
    result: str | None = None,
    *,
    kind: DependencyKind = DependencyKind.AFTEROK,
) -> DependencyState:
    """A dependency of `kind` on session `n` standing at `status` (None: no such session)."""
    return DependencyState(session_id=session_id(n), status=status, result=result, kind=kind)


def snapshot(
    *,
    pending: Sequence[PendingSession] = (),
    agents: AgentPool | None = None,
    usage: Mapping[int, OwnerUsage] | Mapping[UserId, OwnerUsage] | None = None,
    dependencies: Mapping[SessionId, Sequence[DependencyState]] | None = None,
    options: ResourceGroupOptions | None = None,
    group: str = "default",
    now: float | datetime = 3600,
    array_active: Mapping[int, int] | None = None,
    owners: Mapping[int, OwnerAccess] | None = None,
) -> GroupSnapshot:
    """A snapshot of one resource group (default: no agents, nobody holding anything, and
    options that let users give any priority: these tests are about order, not access)."""
    return GroupSnapshot(
        group=group,
        options=options or ANY_PRIORITY,
        pending=list(pending),
        agents=agents if agents is not None else AgentPool.empty(),
        usage={user(owner): u for owner, u in (usage or {}).items()},
        dependencies={sid: list(deps) for sid, deps in (dependencies or {}).items()},
        now=at(now),
        array_active={session_id(a): n for a, n in (array_active or {}).items()},
        owners={user(owner): access for owner, access in (owners or {}).items()},
    )


def _matrix(rows: Sequence[Mapping[str, int]], names: Sequence[str]) -> Int64Array:
    matrix = np.zeros((len(rows), len(names)), dtype=np.int64)
    for r, slots in enumerate(rows):
        for c, name in enumerate(names):
            matrix[r, c] = slots.get(name, 0)
    return matrix
