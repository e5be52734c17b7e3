"""What the dashboard's pages read that no API route reads: counts, per-minute activity, the
capacity of each resource group and the pending queue in the scheduler's order.

Every read takes the viewer's `owner_id` (None: an admin, everything), so a plain user's page
is built only from their own sessions: the API's isolation rule, applied in the query.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.slots import ResourceSlots
from corral.domain.status import SessionStatus
from corral.scheduler.explain import Explanation, explain_many
from corral.store.admission import read_admission_blocker
from corral.store.database import Database
from corral.store.group_options import group_options
from corral.store.tables import agent_slots, agents, events, sessions, users

ACTIVITY_MINUTES = 60  # the overview's chart: sessions started and ended per minute, this far back
MAX_QUEUE_SHOWN = 500  # pending sessions explained per queue page (the oldest first)


async def last_event_id(db: Database) -> int:
    """The newest event's id (0: none yet): a page read after it streams the events after it,
    so a change between rendering the page and opening its stream is not missed."""
    async with db.read() as conn:
        return int(await conn.scalar(sa.select(sa.func.max(events.c.id))) or 0)


async def count_by_status(db: Database, owner_id: uuid.UUID | None) -> dict[str, int]:
    """How many sessions are in each status (every status listed, zeros included)."""
    query = sa.select(sessions.c.status, sa.func.count()).group_by(sessions.c.status)
    if owner_id is not None:
        query = query.where(sessions.c.owner_id == owner_id)
    async with db.read() as conn:
        found = {status: int(n) for status, n in await conn.execute(query)}
    return {s.value: found.get(s.value, 0) for s in SessionStatus}


@record
class MinuteActivity:
    """Sessions started and ended in one minute."""

    minute: datetime
    started: int
    ended: int


async def activity(db: Database, owner_id: uuid.UUID | None, now: datetime) -> list[MinuteActivity]:
    """Sessions started and ended per minute over the last `ACTIVITY_MINUTES`, oldest first."""
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=ACTIVITY_MINUTES)
    counts: dict[str, dict[int, int]] = {"started": defaultdict(int), "ended": defaultdict(int)}
    async with db.read() as conn:
        for what, column in (
            ("started", sessions.c.started_at),
            ("ended", sessions.c.terminated_at),
        ):
            query = sa.select(column).where(column >= start)
            if owner_id is not None:
                query = query.where(sessions.c.owner_id == owner_id)
            for (at,) in await conn.execute(query):
                counts[what][int((at - start).total_seconds() // 60)] += 1
    return [
        MinuteActivity(start + timedelta(minutes=i), counts["started"][i], counts["ended"][i])
        for i in range(ACTIVITY_MINUTES)
    ]


@record
class SlotUse:
    """One slot type's capacity and use, in its own units (`mem` in bytes), with what a bar
    shows of them: worked out once when read (`of`), not at every page that shows them (a
    page of 1,000 agents formatted 3,000 amounts per dashboard)."""

    name: str
    used: Decimal
    total: Decimal
    percent: int  # how full, 0 to 100, for a bar's width
    text: str  # `used / total` in the slot's human units

    @classmethod
    def of(cls, name: str, used: Decimal, total: Decimal) -> SlotUse:
        percent = 0 if total <= 0 else min(100, int(used * 100 / total))
        shown_used = ResourceSlots({name: used}).format_brief() if used else "0"
        shown_total = ResourceSlots({name: total}).format_brief()
        text = f"{shown_used.split('=', 1)[-1]} / {shown_total.split('=', 1)[-1]} {name}"
        return cls(name, used, total, percent, text)


@record
class GroupCapacity:
    """A resource group's alive agents and their slots, used and free."""

    name: str
    agents_alive: int
    agents_other: int
    slots: tuple[SlotUse, ...]


def slot_uses(capacity: dict[str, int], occupied: dict[str, int]) -> tuple[SlotUse, ...]:
    """Per slot type (cpu and mem first), used and total, from milli-unit amounts."""
    offered = ResourceSlots.from_milli(capacity)
    held = ResourceSlots.from_milli({k: v for k, v in occupied.items() if k in capacity})
    order = sorted(offered, key=lambda n: ({"cpu": 0, "mem": 1}.get(n, 2), n))
    return tuple(SlotUse.of(n, held.get(n, Decimal(0)), offered[n]) for n in order)


@record
class AgentRow:
    """An agent as the agents page shows it, with its slots' capacity and use."""

    id: str
    address: str
    runtime: str
    resource_group: str
    status: str
    schedulable: bool
    last_heartbeat_at: datetime | None
    slots: tuple[SlotUse, ...]


async def agent_rows(db: Database) -> list[AgentRow]:
    """Every agent by id with its slot ledger: one join of `agents` and `agent_slots`, never
    the kernels, so the page costs the same with 100 or 100,000 live kernels."""
    query = (
        sa.select(
            agents.c.id,
            agents.c.address,
            agents.c.runtime,
            agents.c.resource_group,
            agents.c.status,
            agents.c.schedulable,
            agents.c.last_heartbeat_at,
            agent_slots.c.slot_name,
            agent_slots.c.capacity,
            agent_slots.c.occupied,
        )
        .select_from(agents.outerjoin(agent_slots, agent_slots.c.agent_id == agents.c.id))
        .order_by(agents.c.id, agent_slots.c.slot_name)
    )
    rows: dict[str, Any] = {}
    capacity: dict[str, dict[str, int]] = defaultdict(dict)
    occupied: dict[str, dict[str, int]] = defaultdict(dict)
    async with db.read() as conn:
        for row in await conn.execute(query):
            rows.setdefault(row.id, row)
            if row.slot_name is not None:
                capacity[row.id][row.slot_name] = int(row.capacity)
                occupied[row.id][row.slot_name] = int(row.occupied or 0)
    return [
        AgentRow(
            r.id,
            r.address,
            r.runtime,
            r.resource_group,
            r.status,
            bool(r.schedulable),
            r.last_heartbeat_at,
            slot_uses(capacity[agent_id], occupied[agent_id]),
        )
        for agent_id, r in sorted(rows.items())  # by id in one order on both backends
    ]


async def capacity_by_group(db: Database) -> list[GroupCapacity]:
    """Each group's capacity and use over its ALIVE agents, and how many agents it has: two
    GROUP BYs, whatever the number of agents and kernels."""
    alive = agents.c.status == "ALIVE"
    slots_query = (
        sa.select(
            agents.c.resource_group,
            agent_slots.c.slot_name,
            sa.func.sum(agent_slots.c.capacity),
            sa.func.sum(agent_slots.c.occupied),
        )
        .select_from(agents.join(agent_slots, agent_slots.c.agent_id == agents.c.id))
        .where(alive)
        .group_by(agents.c.resource_group, agent_slots.c.slot_name)
    )
    counts_query = sa.select(
        agents.c.resource_group, sa.func.sum(sa.case((alive, 1), else_=0)), sa.func.count()
    ).group_by(agents.c.resource_group)
    capacity: dict[str, dict[str, int]] = defaultdict(dict)
    occupied: dict[str, dict[str, int]] = defaultdict(dict)
    async with db.read() as conn:
        for group, slot, offered, held in await conn.execute(slots_query):
            capacity[group][slot] = int(offered or 0)
            occupied[group][slot] = int(held or 0)
        counts = {g: (int(a), int(n)) for g, a, n in await conn.execute(counts_query)}
    return [
        GroupCapacity(
            name,
            counts[name][0],
            counts[name][1] - counts[name][0],
            slot_uses(capacity[name], occupied[name]),
        )
        for name in sorted(counts)
    ]


@record
class Queued:
    """A pending session as the queue page shows it, with its admission state (issue 36):
    evicted (when, why, how often, back when) and whether it is deactivated."""

    id: uuid.UUID
    number: int
    name: str | None
    owner: str
    resource_group: str
    created_at: datetime
    explanation: Explanation | None
    requeue_count: int = 0
    requeue_at: datetime | None = None
    evicted_at: datetime | None = None
    eviction_reason: str | None = None
    deactivated_at: datetime | None = None

    @property
    def deactivated(self) -> bool:
        """Out of the queue until its owner or an admin activates it."""
        return self.deactivated_at is not None


@record
class AdmissionBlocker:
    """The admitted session a group with `block_admission` waits for, and its KernelsReady
    condition (reason, since)."""

    id: uuid.UUID
    number: int
    owner_id: uuid.UUID
    reason: str | None
    since: datetime | None

    def shown_to(self, viewer: uuid.UUID | None) -> bool:
        """Whether `viewer` (None: an admin) may see which session it is."""
        return viewer is None or viewer == self.owner_id


@record
class GroupQueue:
    """A resource group's pending sessions in the order the scheduler takes them."""

    name: str
    queued: tuple[Queued, ...]
    head: Explanation | None  # the group's first candidate, even if the viewer may not see it
    blocker: AdmissionBlocker | None = None  # what its admission waits for (block_admission)


async def pending_queues(
    db: Database, owner_id: uuid.UUID | None, now: datetime
) -> list[GroupQueue]:
    """Per group, the viewer's pending sessions by their place in the queue (the not-yet-due
    after the candidates, oldest first), and what the head of the queue waits for."""
    query = (
        sa.select(
            sessions.c.id,
            sessions.c.number,
            sessions.c.name,
            users.c.name.label("owner"),
            sessions.c.resource_group,
            sessions.c.created_at,
            sessions.c.requeue_count,
            sessions.c.requeue_at,
            sessions.c.evicted_at,
            sessions.c.eviction_reason,
            sessions.c.deactivated_at,
            sessions.c.requeue_active,
        )
        .select_from(sessions.join(users, users.c.id == sessions.c.owner_id))
        .where(sessions.c.status == SessionStatus.PENDING.value)
        .order_by(sessions.c.created_at, sessions.c.id)
        .limit(MAX_QUEUE_SHOWN)
    )
    if owner_id is not None:
        query = query.where(sessions.c.owner_id == owner_id)
    async with db.read() as conn:
        rows: list[Any] = list(await conn.execute(query))
        blockers = await _admission_blockers(db, conn, {r.resource_group for r in rows})
    why = await explain_many(db, [r.id for r in rows], now)
    groups: dict[str, list[Queued]] = defaultdict(list)
    for r in rows:
        groups[r.resource_group].append(
            Queued(
                r.id,
                r.number,
                r.name,
                r.owner,
                r.resource_group,
                r.created_at,
                why.get(r.id),
                requeue_count=int(r.requeue_count),
                requeue_at=r.requeue_at,
                evicted_at=r.evicted_at,
                eviction_reason=r.eviction_reason,
                deactivated_at=r.deactivated_at if not r.requeue_active else None,
            )
        )
    out = []
    for name in sorted(groups):
        queued = sorted(groups[name], key=_queue_order)
        head = next(
            (q.explanation for q in queued if q.explanation and q.explanation.position == 1), None
        )
        out.append(GroupQueue(name, tuple(queued), head, blockers.get(name)))
    return out


async def _admission_blockers(
    db: Database, conn: AsyncConnection, groups: Collection[str]
) -> dict[str, AdmissionBlocker]:
    """Per group of `groups` whose admission blocks (`block_admission`), the admitted session
    it waits for, if any: the scheduler's own pick (`read_admission_blocker`)."""
    options = await group_options(db, conn)
    found: dict[str, AdmissionBlocker] = {}
    for group in sorted(groups):
        stored = options.get(group) or {}
        if not ResourceGroupOptions.model_validate(stored).wait_for_kernels_ready.blocks:
            continue
        blocker = await read_admission_blocker(conn, group)
        if blocker is None:
            continue
        owner, reason, since = (
            await conn.execute(
                sa.select(
                    sessions.c.owner_id,
                    sessions.c.kernels_ready_reason,
                    sessions.c.kernels_ready_at,
                ).where(sessions.c.id == blocker[0])
            )
        ).one()
        found[group] = AdmissionBlocker(blocker[0], blocker[1], owner, reason, since)
    return found


def _queue_order(queued: Queued) -> tuple[int, datetime]:
    position = queued.explanation.position if queued.explanation else None
    return (position if position is not None else 1 << 62, queued.created_at)
