"""Agents as users and admins see them: listing with slot ledger and kernel count; drain;
removal of agents that left."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import Event
from corral.domain.record import record
from corral.domain.status import KERNEL_NON_TERMINAL
from corral.domain.types import AgentId
from corral.store._sql import in_values
from corral.store.agent_kernels import on_agent, on_agents
from corral.store.agents import AGENT_ALIVE
from corral.store.database import Database
from corral.store.events import append_events
from corral.store.tables import agent_slots, agents, kernels

AGENT_DRAINED = "agent.drained"
AGENT_UNDRAINED = "agent.undrained"
AGENT_REMOVED = "agent.removed"


class AgentInUseError(ValueError):
    """The agent cannot be removed: it is ALIVE, or kernels on it have not ended."""


@record
class AgentView:
    """One agent: identity, state, slot capacity and occupancy (milli-units), live kernels."""

    id: AgentId
    address: str
    resource_group: str
    status: str
    schedulable: bool
    runtime: str
    labels: dict[str, str]
    last_heartbeat_at: datetime | None
    status_changed_at: datetime
    created_at: datetime
    capacity: dict[str, int]
    occupied: dict[str, int]
    kernel_count: int


_COLUMNS = (
    agents.c.id,
    agents.c.address,
    agents.c.resource_group,
    agents.c.status,
    agents.c.schedulable,
    agents.c.runtime,
    agents.c.labels,
    agents.c.last_heartbeat_at,
    agents.c.status_changed_at,
    agents.c.created_at,
)


async def list_agents(
    db: Database,
    *,
    after_id: str | None = None,
    limit: int = 100,
    status: str | None = None,
    resource_group: str | None = None,
) -> list[AgentView]:
    """Up to `limit` agents with ids above `after_id`, by id, optionally of one status/group."""
    query = sa.select(*_COLUMNS).order_by(agents.c.id).limit(limit)
    if after_id is not None:
        query = query.where(agents.c.id > after_id)
    if status is not None:
        query = query.where(agents.c.status == status)
    if resource_group is not None:
        query = query.where(agents.c.resource_group == resource_group)
    async with db.read() as conn:
        rows = list(await conn.execute(query))
        return await _views(conn, db, rows)


async def get_agent(db: Database, agent_id: AgentId) -> AgentView | None:
    """One agent (None: no such agent)."""
    async with db.read() as conn:
        rows = list(await conn.execute(sa.select(*_COLUMNS).where(agents.c.id == agent_id)))
        views = await _views(conn, db, rows)
    return views[0] if views else None


async def set_schedulable(
    db: Database, agent_id: AgentId, schedulable: bool, now: datetime
) -> tuple[bool, list[Event]]:
    """Let the scheduler place kernels on the agent, or not (its kernels keep running).

    Returns whether the agent exists and the event recording a change (none if the agent
    already was so).
    """
    async with db.transaction() as conn:
        exists = await conn.scalar(sa.select(agents.c.id).where(agents.c.id == agent_id))
        if exists is None:
            return False, []
        changed = await conn.execute(
            agents.update()
            .where(agents.c.id == agent_id, agents.c.schedulable.is_not(schedulable))
            .values(schedulable=schedulable)
        )
        if not changed.rowcount:
            return True, []
        event = Event(
            kind=AGENT_UNDRAINED if schedulable else AGENT_DRAINED,
            entity_type="agent",
            entity_id=agent_id,
            payload={"schedulable": schedulable},
            created_at=now,
        )
        return True, await append_events(conn, [event], now)


async def remove_agent(db: Database, agent_id: AgentId, now: datetime) -> list[Event] | None:
    """Delete an agent that left (LOST or TERMINATED) and has no kernel that has not ended,
    with its slot ledger; the `agent.removed` event (None: no such agent).

    AgentInUseError for an ALIVE agent (it would only register again) or one with live
    kernels (a lost agent's unstarted kernels are still being placed elsewhere). Its ended
    kernels keep its id, as history.
    """
    async with db.transaction() as conn:
        row = (
            await conn.execute(
                sa.select(agents.c.status).where(agents.c.id == agent_id).with_for_update()
            )
        ).first()
        if row is None:
            return None
        if row[0] == AGENT_ALIVE:
            raise AgentInUseError(
                f"agent {agent_id} is ALIVE; stop it, and remove it once it is LOST (no "
                "heartbeat for the manager's heartbeat_timeout_s); `corral agent drain` keeps "
                "new work off it meanwhile"
            )
        live = await conn.scalar(
            sa.select(sa.func.count())
            .select_from(kernels)
            .where(on_agent(agent_id), kernels.c.status.in_([s.value for s in KERNEL_NON_TERMINAL]))
        )
        if live:
            raise AgentInUseError(
                f"agent {agent_id} still has {live} kernel(s) that have not ended (its sessions "
                "are being placed elsewhere or failed); try again once they have"
            )
        await conn.execute(agents.delete().where(agents.c.id == agent_id))
        event = Event(
            kind=AGENT_REMOVED,
            entity_type="agent",
            entity_id=agent_id,
            payload={"status": row[0]},
            created_at=now,
        )
        return await append_events(conn, [event], now)


async def _views(conn: AsyncConnection, db: Database, rows: Sequence[Any]) -> list[AgentView]:
    """The views of these agent rows, with their ledgers and live kernel counts."""
    ids = [row[0] for row in rows]
    if not ids:
        return []
    capacity: dict[str, dict[str, int]] = {}
    occupied: dict[str, dict[str, int]] = {}
    ledger = await conn.execute(
        sa.select(
            agent_slots.c.agent_id,
            agent_slots.c.slot_name,
            agent_slots.c.capacity,
            agent_slots.c.occupied,
        )
        .where(in_values(db.dialect, agent_slots.c.agent_id, ids))
        .order_by(agent_slots.c.agent_id, agent_slots.c.slot_name)
    )
    for agent_id, slot, cap, occ in ledger:
        capacity.setdefault(agent_id, {})[slot] = int(cap)
        if occ:
            occupied.setdefault(agent_id, {})[slot] = int(occ)
    live = [s.value for s in KERNEL_NON_TERMINAL]
    counts: dict[str, int] = dict(
        (
            await conn.execute(
                sa.select(kernels.c.agent_id, sa.func.count())
                .where(on_agents(db.dialect, ids), kernels.c.status.in_(live))
                .group_by(kernels.c.agent_id)
            )
        ).all()
    )
    return [
        AgentView(
            id=AgentId(row[0]),
            address=row[1],
            resource_group=row[2],
            status=row[3],
            schedulable=bool(row[4]),
            runtime=row[5],
            labels=dict(row[6] or {}),
            last_heartbeat_at=row[7],
            status_changed_at=row[8],
            created_at=row[9],
            capacity=capacity.get(row[0], {}),
            occupied=occupied.get(row[0], {}),
            kernel_count=int(counts.get(row[0], 0)),
        )
        for row in rows
    ]
