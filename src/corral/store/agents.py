"""Agents and their slot ledger: capacity and occupancy per (agent, slot), in milli-units.

Occupancy only changes inside the transaction that changes the kernels holding it. Writers lock
the ledger rows they touch (in a fixed order, so two writers cannot deadlock on them), decide
from the locked values what still fits, and apply relative deltas; the table's CHECK constraints
reject any overcommit or negative occupancy that slipped past, failing the whole transaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.session import MilliSlots
from corral.domain.types import AgentId
from corral.store._direct import DirectStatement
from corral.store._sql import in_param, payload
from corral.store.database import Database, Dialect
from corral.store.tables import agent_slots, agents

K = TypeVar("K", bound=Hashable)

AGENT_ALIVE = "ALIVE"  # the only status whose agents take and keep work

# capacity and occupancy of every slot of every locked agent: {agent: {slot: [capacity, occupied]}}
Ledger = dict[AgentId, dict[str, list[int]]]


@record
class NewAgent:
    """What registering an agent writes."""

    id: AgentId
    address: str
    capacity: MilliSlots
    resource_group: str = "default"
    runtime: str = "process"
    labels: Mapping[str, str] = field(default_factory=dict)
    token_hash: str | None = None


class Holding(Protocol):
    """Slots held on one agent (e.g. by one kernel)."""

    @property
    def agent_id(self) -> AgentId: ...

    @property
    def slots(self) -> MilliSlots: ...


@record
class Claim(Generic[K]):
    """Slots that one unit of work (`key`, e.g. a session) needs, on each agent it holds."""

    key: K
    holdings: Sequence[Holding]


async def insert_agents(db: Database, new_agents: Sequence[NewAgent], now: datetime) -> None:
    """Create agents (ALIVE, schedulable) with their slot capacities, in one transaction."""
    if not new_agents:
        return
    async with db.transaction() as conn:
        await conn.execute(
            agents.insert(),
            [
                {
                    "id": a.id,
                    "address": a.address,
                    "resource_group": a.resource_group,
                    "status": AGENT_ALIVE,
                    "schedulable": True,
                    "runtime": a.runtime,
                    "labels": dict(a.labels),
                    "last_heartbeat_at": now,
                    "assignment_revision": 0,
                    "token_hash": a.token_hash,
                    "created_at": now,
                    "status_changed_at": now,
                }
                for a in new_agents
            ],
        )
        await conn.execute(
            agent_slots.insert(),
            [
                {"agent_id": a.id, "slot_name": name, "capacity": amount, "occupied": 0}
                for a in new_agents
                for name, amount in a.capacity.items()
            ],
        )


async def lock_ledger(
    conn: AsyncConnection, dialect: Dialect, agent_ids: Iterable[AgentId]
) -> Ledger:
    """Read and lock (PostgreSQL: FOR UPDATE, in key order) the ledger rows of these agents."""
    ids = sorted(set(agent_ids))
    if not ids:
        return {}
    rows = await _LOCK_LEDGER.rows(conn, {"ids": payload(dialect, ids)})
    return _ledger(rows, {AgentId(agent_id): {} for agent_id in ids})


def fit_claims(
    ledger: Ledger, claims: Sequence[Claim[K]]
) -> tuple[list[K], dict[AgentId, dict[str, int]]]:
    """Accept claims in order (one per key), each whole or not at all; return keys and deltas.

    A key (a session) is accepted only if all of its holdings fit what is still free after the
    keys accepted before it; a slot the agent does not have has capacity 0. The ledger is not
    modified.
    """
    free: dict[tuple[AgentId, str], int] = {
        (agent_id, slot): capacity - occupied
        for agent_id, slots in ledger.items()
        for slot, (capacity, occupied) in slots.items()
    }
    # Fast path, the common case: the whole plan fits what is free, so every key is accepted.
    total: dict[AgentId, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for claim in claims:
        for holding in claim.holdings:
            per_agent = total[holding.agent_id]
            for slot, amount in holding.slots.items():
                per_agent[slot] += amount
    if all(
        amount <= 0 or free.get((agent_id, slot), 0) >= amount
        for agent_id, slots in total.items()
        for slot, amount in slots.items()
    ):
        return [claim.key for claim in claims], {
            agent: {s: a for s, a in cells.items() if a} for agent, cells in total.items()
        }

    accepted: list[K] = []
    deltas: dict[AgentId, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for claim in claims:
        need: dict[tuple[AgentId, str], int] = defaultdict(int)
        for holding in claim.holdings:
            for slot, amount in holding.slots.items():
                if amount:
                    need[(holding.agent_id, slot)] += amount
        if all(free.get(cell, 0) >= amount for cell, amount in need.items()):
            accepted.append(claim.key)
            for cell, amount in need.items():
                free[cell] -= amount
                deltas[cell[0]][cell[1]] += amount
    return accepted, {agent: dict(slots) for agent, slots in deltas.items()}


async def apply_slot_deltas(
    conn: AsyncConnection, deltas: Mapping[AgentId, Mapping[str, int]]
) -> None:
    """Add (occupy) or subtract (release) milli-slots, one batched statement, in key order."""
    params = [
        {"a": agent_id, "s": slot, "d": amount}
        for agent_id in sorted(deltas)
        for slot, amount in sorted(deltas[agent_id].items())
        if amount
    ]
    await _ADD_OCCUPIED.run_many(conn, params)


_ADD_OCCUPIED = DirectStatement(
    lambda _dialect: (
        agent_slots.update()
        .where(
            agent_slots.c.agent_id == sa.bindparam("a", type_=agent_slots.c.agent_id.type),
            agent_slots.c.slot_name == sa.bindparam("s", type_=agent_slots.c.slot_name.type),
        )
        .values(occupied=agent_slots.c.occupied + sa.bindparam("d", type_=sa.BigInteger()))
    )
)


async def read_ledger(db: Database) -> Ledger:
    """Every agent's capacity and occupancy (for checks and listings)."""
    async with db.read() as conn:
        return _ledger(await conn.execute(_LEDGER_ROWS), {})


_LEDGER_ROWS = sa.select(
    agent_slots.c.agent_id, agent_slots.c.slot_name, agent_slots.c.capacity, agent_slots.c.occupied
)
_LOCK_LEDGER = DirectStatement(
    lambda dialect: (
        _LEDGER_ROWS.where(in_param(dialect, agent_slots.c.agent_id, "ids"))
        .order_by(agent_slots.c.agent_id, agent_slots.c.slot_name)
        .with_for_update()
    )
)


def _ledger(rows: Iterable[Any], ledger: Ledger) -> Ledger:
    """Fill `ledger` from (agent, slot, capacity, occupied) rows."""
    for agent_id, slot_name, capacity, occupied in rows:
        ledger.setdefault(AgentId(agent_id), {})[slot_name] = [capacity, occupied]
    return ledger
