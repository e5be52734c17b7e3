"""Builders shared by the store integration tests: users, agents, sessions, plans, ledger."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from corral.domain.outcome import DependencyKind
from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.session import MilliSlots, NewSession, SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import USER_ROLE, AgentId, SessionId, UserId
from corral.store.agents import NewAgent, insert_agents, read_ledger
from corral.store.database import Database
from corral.store.group_options import forget_group_options
from corral.store.placements import KernelPlacement, SessionPlacement, commit_placements
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from corral.store.tables import agent_kernels, resource_groups, session_history, sessions, users
from corral.store.tables import agents as agents_table

NOW = datetime(2030, 1, 1, tzinfo=UTC)

# The guarded changes the scheduler's phases make, aimed at no session yet (see `on`).
RELEASE = StatusChange(
    session_ids=(),
    phase="PrepareSessions",
    result=SchedulingResult.GIVE_UP,
    expected=frozenset({SessionStatus.SCHEDULED, SessionStatus.PREPARING}),
    target=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
)
PREPARE = StatusChange(
    session_ids=(),
    phase="PrepareSessions",
    result=SchedulingResult.SUCCESS,
    expected=frozenset({SessionStatus.SCHEDULED}),
    target=TransitionStatus(SessionStatus.PREPARING, KernelStatus.PREPARING),
)
MARK_TERMINATING = StatusChange(
    session_ids=(),
    phase="TerminateRequest",
    result=SchedulingResult.SUCCESS,
    expected=frozenset({SessionStatus.SCHEDULED, SessionStatus.PREPARING}),
    target=TransitionStatus(SessionStatus.TERMINATING, KernelStatus.TERMINATING),
)
TERMINATE = StatusChange(
    session_ids=(),
    phase="TerminateSessions",
    result=SchedulingResult.SUCCESS,
    expected=frozenset({SessionStatus.TERMINATING}),
    target=TransitionStatus(SessionStatus.TERMINATED, KernelStatus.TERMINATED),
)
CANCEL = StatusChange(
    session_ids=(),
    phase="ScheduleNewSessions",
    result=SchedulingResult.GIVE_UP,
    expected=frozenset({SessionStatus.PENDING}),
    target=TransitionStatus(SessionStatus.CANCELLED, KernelStatus.CANCELLED),
)


def on(change: StatusChange, session_ids: Sequence[SessionId]) -> StatusChange:
    """`change` aimed at `session_ids`."""
    return dataclasses.replace(change, session_ids=tuple(session_ids))


async def add_user(db: Database, role: str = USER_ROLE) -> UserId:
    """A fresh user to own sessions (an admin's may have any priority in any group)."""
    user_id = UserId(uuid.uuid4())
    async with db.transaction() as conn:
        await conn.execute(
            users.insert().values(id=user_id, name=f"u-{user_id.hex}", role=role, created_at=NOW)
        )
    return user_id


async def add_agents(db: Database, capacities: Sequence[MilliSlots]) -> dict[AgentId, MilliSlots]:
    """Fresh agents with these capacities (milli-units), by id."""
    prefix = uuid.uuid4().hex[:8]
    new = [
        NewAgent(id=AgentId(f"agent-{prefix}-{i:03}"), address=f"10.0.{i}.1:6001", capacity=cap)
        for i, cap in enumerate(capacities)
    ]
    await insert_agents(db, new, NOW)
    return {a.id: dict(a.capacity) for a in new}


async def add_sessions(
    db: Database,
    owner: UserId,
    shapes: Sequence[tuple[int, MilliSlots]],
    *,
    group: str = "default",
) -> list[SessionWithKernels]:
    """PENDING sessions of the given (cluster size, per-kernel slots), read back in this order."""
    new = [
        NewSession(
            id=SessionId(uuid.uuid4()),
            owner_id=owner,
            type="BATCH",
            resource_group=group,
            cluster_mode="multi-node" if size > 1 else "single-node",
            cluster_size=size,
            spec={"image": "python", "command": ["true"]},
            kernel_slots=dict(slots),
        )
        for size, slots in shapes
    ]
    await SessionRepository(db).insert(new, NOW)
    found = {s.id: s for s in await SessionRepository(db).get([s.id for s in new])}
    return [found[s.id] for s in new]


async def add_session_ids(
    db: Database,
    owner: UserId,
    count: int,
    *,
    cluster_size: int = 1,
    group: str = "default",
    cpu_milli: int = 1000,
) -> list[SessionId]:
    """Ids of `count` PENDING sessions alike, each kernel asking for `cpu_milli` of cpu."""
    shapes = [(cluster_size, {"cpu": cpu_milli})] * count
    return [s.id for s in await add_sessions(db, owner, shapes, group=group)]


def placement(session: SessionWithKernels, agent_ids: Sequence[AgentId]) -> SessionPlacement:
    """Kernel i of `session` on agent_ids[i], holding what it requested."""
    return SessionPlacement(
        session.id,
        tuple(
            KernelPlacement(k.cluster_index, agent, k.requested_slots)
            for k, agent in zip(session.kernels, agent_ids, strict=True)
        ),
    )


def plan_on(
    sessions: Sequence[SessionWithKernels], agent_ids: Sequence[AgentId]
) -> list[SessionPlacement]:
    """Kernel i of each session on agent_ids[i % len(agent_ids)]."""
    return [
        placement(s, [agent_ids[i % len(agent_ids)] for i in range(len(s.kernels))])
        for s in sessions
    ]


async def place_all(db: Database, ids: Sequence[SessionId], agent: AgentId) -> None:
    """Commit every kernel of these sessions onto `agent`; all of them must be placed."""
    outcome = await commit_placements(
        db, plan_on(await SessionRepository(db).get(ids), [agent]), NOW
    )
    assert sorted(outcome.placed) == sorted(ids)


async def assert_slots_consistent(
    db: Database, agents: Mapping[AgentId, MilliSlots], session_ids: Collection[SessionId]
) -> list[SessionWithKernels]:
    """Ledger within [0, capacity], equal to what the kernels hold; placement all or nothing.

    Also: `agent_kernels` lists exactly the kernels that have an agent, on that agent.
    """
    found = await SessionRepository(db).get(session_ids)
    kernels = [k for s in found for k in s.kernels]
    async with db.read() as conn:
        rows = await conn.execute(sa.select(agent_kernels.c.agent_id, agent_kernels.c.kernel_id))
        listed = {(a, k) for a, k in rows if k in {kernel.id for kernel in kernels}}
    assert listed == {(k.agent_id, k.id) for k in kernels if k.agent_id is not None}, (
        "agent_kernels does not list exactly the kernels that have an agent"
    )
    held: dict[AgentId, Counter[str]] = defaultdict(Counter)
    for session in found:
        placed = [k.agent_id is not None for k in session.kernels]
        assert all(placed) or not any(placed), f"session {session.id} is partly placed"
        for k in session.kernels:
            if k.occupied_slots is not None:
                assert k.agent_id is not None, f"kernel {k.id} holds slots without an agent"
                assert k.agent_id in agents, f"kernel {k.id} holds slots on a stranger"
                held[k.agent_id].update(k.occupied_slots)
    ledger = await read_ledger(db)
    for agent_id, capacity in agents.items():
        for slot, amount in capacity.items():
            cap, occupied = ledger[agent_id][slot]
            assert cap == amount
            assert 0 <= occupied <= cap, f"{agent_id}/{slot}: {occupied} of {cap}"
            assert occupied == held[agent_id][slot], f"{agent_id}/{slot} leaks"
        for slot, amount in held[agent_id].items():
            assert slot in capacity or amount == 0, f"{agent_id} holds {slot} it does not have"
    return found


def assert_kernels_follow_sessions(found: Sequence[SessionWithKernels]) -> None:
    """Occupying sessions hold their request on agents; PENDING and ended ones hold nothing."""
    occupying = (SessionStatus.SCHEDULED, SessionStatus.PREPARING, SessionStatus.TERMINATING)
    for s in found:
        for k in s.kernels:
            if s.status in occupying:
                assert k.agent_id is not None and k.occupied_slots == k.requested_slots
            else:
                assert k.occupied_slots is None
            if s.status is SessionStatus.PENDING:
                assert (k.status, k.agent_id) == (KernelStatus.PENDING, None)


async def update_sessions(db: Database, ids: Collection[SessionId], **values: Any) -> None:
    """Write columns of these sessions directly, as another phase or an operator would have."""
    async with db.transaction() as conn:
        await conn.execute(sessions.update().where(sessions.c.id.in_(list(ids))).values(**values))


async def update_agents(db: Database, ids: Collection[AgentId], **values: Any) -> None:
    """Write columns of these agents directly (status LOST, schedulable false, ...)."""
    async with db.transaction() as conn:
        await conn.execute(
            agents_table.update().where(agents_table.c.id.in_(list(ids))).values(**values)
        )


async def add_group(db: Database, name: str, options: Mapping[str, Any] | None = None) -> None:
    """A resource group row with these scheduling options (default: none set)."""
    async with db.transaction() as conn:
        await conn.execute(
            resource_groups.insert().values(name=name, options=dict(options or {}), created_at=NOW)
        )
    forget_group_options(db)  # as resource_group_store does after its writes


async def set_group_options(db: Database, name: str, options: Mapping[str, Any]) -> None:
    """Replace the stored scheduling options of a resource group."""
    async with db.transaction() as conn:
        await conn.execute(
            resource_groups.update()
            .where(resource_groups.c.name == name)
            .values(options=dict(options))
        )
    forget_group_options(db)


async def add_dependent(
    db: Database,
    owner: UserId,
    depends_on: Sequence[SessionId],
    *,
    cpu_milli: int = 1000,
    group: str = "default",
    kind: DependencyKind = DependencyKind.AFTEROK,
) -> SessionId:
    """A PENDING single-kernel session that depends on `depends_on` (each of that kind)."""
    session_id = SessionId(uuid.uuid4())
    await SessionRepository(db).insert(
        [
            NewSession(
                id=session_id,
                owner_id=owner,
                type="BATCH",
                resource_group=group,
                cluster_mode="single-node",
                cluster_size=1,
                spec={"image": "python", "command": ["true"]},
                kernel_slots={"cpu": cpu_milli},
                dependencies=tuple((on, kind) for on in depends_on),
            )
        ],
        NOW,
    )
    return session_id


async def history_rows(db: Database, phase: str) -> list[tuple[SessionId, str, str | None, int]]:
    """(session, result, to_status, attempts) of every session history row of `phase`."""
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(
                session_history.c.session_id,
                session_history.c.result,
                session_history.c.to_status,
                session_history.c.attempts,
            )
            .where(session_history.c.phase == phase)
            .order_by(session_history.c.id)
        )
        return [(SessionId(sid), result, to, attempts) for sid, result, to, attempts in rows]


async def number_of(db: Database, session_id: SessionId) -> int:
    """The session's short number (as users name it in messages)."""
    async with db.read() as conn:
        number = await conn.scalar(sa.select(sessions.c.number).where(sessions.c.id == session_id))
    assert number is not None, session_id
    return int(number)
