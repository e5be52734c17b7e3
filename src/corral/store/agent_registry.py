"""Agents joining, staying in touch and getting lost: registration, heartbeats, the lost sweep.

An agent that stops heartbeating past its timeout is LOST: in one transaction its status moves,
its started kernels (RUNNING, TERMINATING) move to ERROR with cause `agent_lost` (history
written, slots released), and its revision is bumped so that, should it come back, it
reconciles at once. The session handlers take the sessions from there (DetectTermination;
for kernels not started, PrepareSessions / StartSessions give the attempt up: back to PENDING).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.session import MilliSlots
from corral.domain.status import KERNEL_NON_TERMINAL, KERNEL_STARTED, KernelStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store._direct import DirectStatement
from corral.store._sql import in_param, payload
from corral.store.agent_kernels import on_agent, on_agents
from corral.store.agents import AGENT_ALIVE, NewAgent, insert_agents
from corral.store.assignments import bump_revisions, update_agents_in_id_order
from corral.store.database import Database
from corral.store.kernel_checks import fail_kernels
from corral.store.tables import agent_slots, agents, kernels

AGENT_LOST = "LOST"
AGENT_TERMINATED = "TERMINATED"
# A lost agent's kernels in these had started: they fail with AGENT_LOST_CAUSE.
_STARTED = frozenset(s.value for s in KERNEL_STARTED)
PHASE_HEARTBEAT = "heartbeat"


class AgentCapacityError(ValueError):
    """A re-registering agent offers less of a slot than its kernels already hold."""


@record
class AgentRecord:
    """An agent as the protocol layer needs it: identity, credentials, liveness."""

    id: AgentId
    status: str
    token_hash: str | None
    resource_group: str
    last_heartbeat_at: datetime | None
    assignment_revision: int


@dataclass(slots=True)
class LostAgents:
    """What one lost sweep changed."""

    agent_ids: list[AgentId] = field(default_factory=list)
    kernels: dict[KernelId, KernelStatus] = field(default_factory=dict)  # status before ERROR
    sessions: set[SessionId] = field(default_factory=set)  # of the failed kernels
    # Sessions with a kernel on a lost agent that had not started: a failed attempt of their
    # phase for the session's handler (back to PENDING, placed elsewhere), not their end.
    unstarted: set[SessionId] = field(default_factory=set)


async def read_agent(db: Database, agent_id: AgentId) -> AgentRecord | None:
    """One agent's identity and liveness (None: no such agent).

    Every call an agent makes is authenticated with it: a statement built once."""
    async with db.read_statements() as conn:
        rows = await _READ_AGENT.rows(conn, {"id": agent_id})
    if not rows:
        return None
    row = rows[0]
    return AgentRecord(AgentId(row[0]), row[1], row[2], row[3], row[4], int(row[5]))


_READ_AGENT = DirectStatement(
    lambda _dialect: sa.select(
        agents.c.id,
        agents.c.status,
        agents.c.token_hash,
        agents.c.resource_group,
        agents.c.last_heartbeat_at,
        agents.c.assignment_revision,
    ).where(agents.c.id == sa.bindparam("id", type_=agents.c.id.type))
)


async def register_agent(db: Database, agent: NewAgent, now: datetime) -> bool:
    """Create the agent, or bring a known one back ALIVE with its new facts; True if created.

    Re-registering keeps the agent's id, revision and the occupancy of its slots; a slot whose
    new capacity is below what the agent's kernels hold is refused (AgentCapacityError), as is
    moving an agent holding kernels to another resource group.
    """
    async with db.read() as conn:
        exists = await conn.scalar(
            sa.select(agents.c.resource_group).where(agents.c.id == agent.id)
        )
    if exists is None:
        try:
            await insert_agents(db, [agent], now)
        except sa.exc.IntegrityError:
            # Registered by a concurrent request of the same agent: update below instead.
            pass
        else:
            return True
    async with db.transaction() as conn:
        ledger_rows = await conn.execute(
            sa.select(agent_slots.c.slot_name, agent_slots.c.occupied)
            .where(agent_slots.c.agent_id == agent.id)
            .with_for_update()
        )
        occupied = {name: int(amount) for name, amount in ledger_rows}
        short = {
            name: amount
            for name, amount in occupied.items()
            if amount > agent.capacity.get(name, 0)
        }
        if short:
            raise AgentCapacityError(
                f"agent {agent.id} re-registered with less than its kernels hold: "
                + ", ".join(
                    f"{name} offered {agent.capacity.get(name, 0) / 1000:g}, held {amount / 1000:g}"
                    for name, amount in sorted(short.items())
                )
            )
        if exists is not None and exists != agent.resource_group and any(occupied.values()):
            raise AgentCapacityError(
                f"agent {agent.id} holds kernels in resource group {exists!r}; it cannot move "
                f"to {agent.resource_group!r} until they end"
            )
        values: dict[str, Any] = {
            "address": agent.address,
            "resource_group": agent.resource_group,
            "runtime": agent.runtime,
            "labels": dict(agent.labels),
            "status": AGENT_ALIVE,
            "last_heartbeat_at": now,
            "status_changed_at": sa.case(
                (agents.c.status != AGENT_ALIVE, now), else_=agents.c.status_changed_at
            ),
        }
        if agent.token_hash is not None:
            values["token_hash"] = agent.token_hash
        await conn.execute(agents.update().where(agents.c.id == agent.id).values(values))
        await _set_capacity(conn, agent.id, agent.capacity, occupied)
        await bump_revisions(conn, db.dialect, [agent.id])
    return False


async def _set_capacity(
    conn: Any, agent_id: AgentId, capacity: MilliSlots, occupied: Mapping[str, int]
) -> None:
    """Make the agent's ledger rows say `capacity`, keeping occupancy; drop unused slots."""
    gone = [name for name in occupied if name not in capacity]
    if gone:
        await conn.execute(
            agent_slots.delete().where(
                agent_slots.c.agent_id == agent_id, agent_slots.c.slot_name.in_(gone)
            )
        )
    kept = [{"a": agent_id, "s": n, "c": c} for n, c in capacity.items() if n in occupied]
    if kept:
        await conn.execute(
            agent_slots.update()
            .where(
                agent_slots.c.agent_id == sa.bindparam("a"),
                agent_slots.c.slot_name == sa.bindparam("s"),
            )
            .values(capacity=sa.bindparam("c")),
            kept,
        )
    added = [
        {"agent_id": agent_id, "slot_name": n, "capacity": c, "occupied": 0}
        for n, c in capacity.items()
        if n not in occupied
    ]
    if added:
        await conn.execute(agent_slots.insert(), added)


async def record_heartbeats(
    db: Database, agent_ids: Collection[AgentId], now: datetime
) -> dict[AgentId, str]:
    """Note that these agents are alive now (one statement); each one's status.

    Unknown agents are left out. A LOST agent stays LOST: its kernels were already failed, so
    it must register again (which makes it reconcile against an assignment without them)
    before it takes work.
    """
    if not agent_ids:
        return {}
    ids = payload(db.dialect, sorted(set(agent_ids)))
    async with db.transaction() as conn:
        rows = await _HEARTBEATS.rows(conn, {"ids": ids, "now": now})
    return {AgentId(agent_id): str(status) for agent_id, status in rows}


# Built once: an idle cluster's heartbeats are most of what its manager does.
_HEARTBEATS = DirectStatement(
    lambda dialect: (
        update_agents_in_id_order(dialect, in_param(dialect, agents.c.id, "ids"))
        .values(last_heartbeat_at=sa.bindparam("now", type_=agents.c.last_heartbeat_at.type))
        .returning(agents.c.id, agents.c.status)
    )
)


async def mark_lost_agents(db: Database, cutoff: datetime, now: datetime) -> LostAgents:
    """Every ALIVE agent silent since before `cutoff` becomes LOST, its started kernels ERROR.

    Kernels it had not started (SCHEDULED … CREATING) keep their status: their sessions'
    PrepareSessions / StartSessions count the lost agent as a failed attempt and send them
    back to PENDING, to be placed elsewhere (spec document 1's give-up transitions).
    """
    lost = LostAgents()
    async with db.transaction() as conn:
        silent = agents.c.last_heartbeat_at < cutoff
        ids = [
            AgentId(agent_id)
            for (agent_id,) in await conn.execute(
                update_agents_in_id_order(
                    db.dialect, sa.and_(agents.c.status == AGENT_ALIVE, silent)
                )
                .values(status=AGENT_LOST, status_changed_at=now)
                .returning(agents.c.id)
            )
        ]
        if not ids:
            return lost
        lost.agent_ids = sorted(ids)
        live = [s.value for s in KERNEL_NON_TERMINAL]
        rows = []
        for row in await conn.execute(
            sa.select(
                kernels.c.id,
                kernels.c.session_id,
                kernels.c.agent_id,
                kernels.c.status,
                kernels.c.occupied_slots,
            ).where(on_agents(db.dialect, ids), kernels.c.status.in_(live))
        ):
            if row[3] in _STARTED:
                rows.append(row)
            else:
                lost.unstarted.add(SessionId(row[1]))
        failed = await fail_kernels(
            conn,
            db.dialect,
            rows,
            phase=PHASE_HEARTBEAT,
            message=f"sent no heartbeat since before {cutoff:%X}: lost",
            now=now,
        )
        for row in failed:
            lost.kernels[KernelId(row.id)] = KernelStatus(row.status)
            lost.sessions.add(SessionId(row.session_id))
        await bump_revisions(conn, db.dialect, ids)
    return lost


async def deregister_agent(db: Database, agent_id: AgentId, now: datetime) -> bool:
    """A cleanly stopping agent leaves: TERMINATED, no more work; True if it could.

    An agent still holding live kernels cannot leave this way: it stays ALIVE, so that if it
    does not come back its kernels are failed by the lost sweep instead of being forgotten.
    """
    live_kernels = sa.exists().where(
        on_agent(agent_id),
        kernels.c.status.in_([s.value for s in KERNEL_NON_TERMINAL]),
    )
    async with db.transaction() as conn:
        result = await conn.execute(
            agents.update()
            .where(agents.c.id == agent_id, agents.c.status == AGENT_ALIVE, ~live_kernels)
            .values(status=AGENT_TERMINATED, status_changed_at=now)
        )
    return bool(result.rowcount)
