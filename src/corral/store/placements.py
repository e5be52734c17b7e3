"""Committing a placement plan: occupy agents' slots and move sessions to SCHEDULED, atomically."""

from __future__ import annotations

import json
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.results import SchedulingResult
from corral.domain.session import MilliSlots
from corral.domain.status import SESSION_TRANSITIONS, KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.store._direct import DirectStatement
from corral.store._sql import IdBatch, id_batch, in_param, payload
from corral.store.agents import (
    AGENT_ALIVE,
    Claim,
    Ledger,
    apply_slot_deltas,
    fit_claims,
    lock_ledger,
)
from corral.store.database import Database, Dialect
from corral.store.history import record_kernel_history, record_session_history
from corral.store.status_changes import kernels_ready_on_move, lock_sessions
from corral.store.tables import agent_kernels, agents, kernels, sessions

PHASE = "ScheduleNewSessions"

# Told, inside the commit's transaction, which sessions were placed and who owns each.
OnCommitted = Callable[
    [AsyncConnection, list[SessionId], Mapping[SessionId, UserId]], Awaitable[None]
]


async def _place_kernels(
    conn: AsyncConnection,
    dialect: Dialect,
    placed: Sequence[SessionPlacement],
    placed_ids: IdBatch,
    now: datetime,
) -> int:
    """Give every kernel of the placed sessions its agent and slots; the kernels moved.

    Each placed kernel also gets its row in `agent_kernels`: on PostgreSQL from the UPDATE's
    RETURNING in the same statement, on SQLite by a second one over the placed sessions (all
    of whose kernels were just placed).

    Kernels are found by (session, cluster index) and occupy what they requested. The agents
    travel as one parameter set, not one parameter row per kernel: on PostgreSQL arrays of
    (session, index, agent) joined in `UPDATE ... FROM unnest(...)`, on SQLite one JSON object
    of each session's agents in index order. Only the indexes the plan names are touched: the
    planner names every kernel of a session (a property test checks it), and the caller's row
    count catches a plan naming a kernel the session lacks.
    """
    if dialect == "postgresql":
        sids: list[SessionId] = []
        indexes: list[int] = []
        agent_ids: list[str] = []
        for p in placed:
            for k in _by_index(p):
                sids.append(p.session_id)
                indexes.append(k.cluster_index)
                agent_ids.append(k.agent_id)
        return await _PLACE_KERNELS.run(
            conn, {"sids": sids, "indexes": indexes, "agents": agent_ids, "now": now}
        )
    agent_json: dict[str, str] = {}
    for p in placed:
        for k in p.kernels:
            if k.agent_id not in agent_json:
                agent_json[k.agent_id] = json.dumps(k.agent_id)
    # {session id hex: [agent of kernel 0, agent of kernel 1, ...]}
    agents_of = (
        "{"
        + ",".join(
            f'"{p.session_id.hex}":[{",".join(agent_json[k.agent_id] for k in _by_index(p))}]'
            for p in placed
        )
        + "}"
    )
    moved = await _PLACE_KERNELS.run(conn, {"placed": agents_of, "now": now})
    await _RECORD_AGENTS.run(conn, {"ids": placed_ids.payload})
    return moved


def _place_kernels_statement(dialect: Dialect) -> sa.Executable:
    """`_place_kernels`' UPDATE (on PostgreSQL inside the INSERT of the `agent_kernels` rows).

    Parameters: `now`, and on PostgreSQL the arrays `sids`, `indexes` and `agents`, on SQLite
    the JSON object `placed`.
    """
    index = kernels.c.cluster_index
    where: sa.ColumnElement[bool]
    agent: sa.ColumnElement[Any]
    if dialect == "postgresql":
        rows = (
            sa.func.unnest(
                sa.bindparam("sids", type_=postgresql.ARRAY(sa.Uuid())),
                sa.bindparam("indexes", type_=postgresql.ARRAY(sa.Integer())),
                sa.bindparam("agents", type_=postgresql.ARRAY(sa.String())),
            )
            .table_valued("sid", "index", "agent")
            .render_derived(name="placed")
        )
        where = sa.and_(kernels.c.session_id == rows.c.sid, index == rows.c.index)
        agent = rows.c.agent
    else:
        each = sa.func.json_each(sa.bindparam("placed", type_=sa.String())).table_valued(
            "key", "value"
        )
        where = sa.and_(
            kernels.c.session_id == each.c.key, index < sa.func.json_array_length(each.c.value)
        )
        agent = sa.func.json_extract(each.c.value, sa.literal("$[").concat(index).concat("]"))
    update = (
        kernels.update()
        .where(where, kernels.c.status == KernelStatus.PENDING.value)
        .values(
            status=KernelStatus.SCHEDULED.value,
            status_changed_at=sa.bindparam("now", type_=kernels.c.status_changed_at.type),
            agent_id=agent,
            occupied_slots=kernels.c.requested_slots,
            # Each placement is a new attempt: reports of an earlier one are told apart.
            attempt=kernels.c.attempt + 1,
        )
    )
    if dialect != "postgresql":
        return update
    moved = update.returning(kernels.c.agent_id, kernels.c.id).cte("moved")
    return agent_kernels.insert().from_select(
        [agent_kernels.c.agent_id, agent_kernels.c.kernel_id],
        sa.select(moved.c.agent_id, moved.c.id),
    )


_PLACE_KERNELS = DirectStatement(_place_kernels_statement)
# SQLite: the `agent_kernels` rows of the placed sessions' kernels, after `_PLACE_KERNELS`.
_RECORD_AGENTS = DirectStatement(
    lambda dialect: agent_kernels.insert().from_select(
        [agent_kernels.c.agent_id, agent_kernels.c.kernel_id],
        sa.select(kernels.c.agent_id, kernels.c.id).where(
            in_param(dialect, kernels.c.session_id, "ids")
        ),
    )
)


def _by_index(placement: SessionPlacement) -> Sequence[KernelPlacement]:
    """The kernels of a placement in cluster-index order, checked to be exactly 0..n-1."""
    ordered = sorted(placement.kernels, key=lambda k: k.cluster_index)
    if [k.cluster_index for k in ordered] != list(range(len(ordered))):
        raise ValueError(
            f"placement of session {placement.session_id} names kernel indexes "
            f"{[k.cluster_index for k in ordered]}, not 0..{len(ordered) - 1}"
        )
    return ordered


@record
class KernelPlacement:
    """Kernel `cluster_index` of a session on one agent, holding `slots`: what it requested."""

    cluster_index: int
    agent_id: AgentId
    slots: MilliSlots


@record
class SessionPlacement:
    """All kernels of one session, placed together or not at all."""

    session_id: SessionId
    kernels: tuple[KernelPlacement, ...]


@dataclass(slots=True)
class PlacementOutcome:
    """What the commit did with each session of the plan."""

    placed: list[SessionId] = field(default_factory=list)
    # the agents no longer had room (changed since the snapshot); still PENDING, untouched
    no_longer_fits: list[SessionId] = field(default_factory=list)
    # no longer PENDING, or a kernel of it is not PENDING (cancelled, placed by someone else,
    # or requeued after a kernel ended); untouched
    stale: list[SessionId] = field(default_factory=list)


async def commit_placements(
    db: Database,
    plan: Sequence[SessionPlacement],
    now: datetime,
    *,
    on_committed: OnCommitted | None = None,
) -> PlacementOutcome:
    """Apply a plan in one transaction; sessions that no longer fit stay PENDING, untouched.

    `on_committed` runs last in the same transaction with the sessions placed and their owners
    (e.g. to append the events describing the placement, so they commit together).
    """
    if not plan:
        return PlacementOutcome()

    async def one_batch() -> AsyncIterator[Sequence[SessionPlacement]]:
        yield plan

    return await commit_placement_batches(
        db,
        one_batch(),
        now,
        agent_ids={k.agent_id for p in plan for k in p.kernels},
        session_ids=[p.session_id for p in plan],
        on_committed=on_committed,
    )


async def commit_placement_batches(
    db: Database,
    batches: AsyncIterable[Sequence[SessionPlacement]],
    now: datetime,
    *,
    agent_ids: Collection[AgentId],
    session_ids: Sequence[SessionId],
    on_locked: Callable[[], None] | None = None,
    on_committed: OnCommitted | None = None,
) -> PlacementOutcome:
    """`commit_placements` for a plan that arrives in batches, all in one transaction.

    The transaction starts before the first batch, so a plan still being made can be written
    as it comes: the ledger rows of `agent_ids` (every agent a batch may name) and the
    sessions of `session_ids` (every session a batch may name) are locked and checked first,
    then each batch is written when it arrives, and the slots are taken last, for the whole
    plan at once. `on_locked` is called when those locks are held and checked, before the
    first batch is read.

    Lock order is ledger rows, then sessions, then kernels; every other writer that touches
    the ledger takes sessions and kernels first only for sessions that are not PENDING, so the
    two orders never meet on the same rows.
    """
    SESSION_TRANSITIONS.check(SessionStatus.PENDING, SessionStatus.SCHEDULED)
    outcome = PlacementOutcome()
    dialect = db.dialect
    async with db.transaction() as conn:
        ledger = await lock_ledger(conn, dialect, agent_ids)
        usable = await _USABLE_AGENTS.scalars(conn, {"ids": payload(dialect, list(ledger))})
        usable_ids = {AgentId(agent_id) for agent_id in usable}
        ledger = {agent: slots for agent, slots in ledger.items() if agent in usable_ids}
        owners: dict[SessionId, UserId] = {}
        # The ids are encoded once: the lock reads all of them, and so do the batch's writes
        # in the usual case, every session of a one-batch plan still PENDING and accepted.
        locked = id_batch(dialect, session_ids)
        ready = await _lock_placeable(conn, dialect, locked, owners)
        if on_locked is not None:
            on_locked()
        taken: dict[AgentId, dict[str, int]] = {}
        async for batch in batches:
            if batch:
                await _commit_batch(
                    conn, dialect, batch, now, locked, ready, ledger, taken, outcome
                )
        if not outcome.placed:
            return outcome
        await apply_slot_deltas(conn, taken)
        if on_committed is not None:
            await on_committed(conn, outcome.placed, owners)
    return outcome


async def _lock_placeable(
    conn: AsyncConnection,
    dialect: Dialect,
    ids: IdBatch,
    owners: dict[SessionId, UserId],
) -> set[SessionId]:
    """Lock these sessions; those still PENDING with every kernel PENDING (owners filled in).

    A session is placeable only while every kernel of it is PENDING too: one whose kernel
    already ended (requeued after a kernel failed) would be charged slots no kernel holds.
    """
    if not ids:
        return set()
    pending = set(await lock_sessions(conn, dialect, ids, [SessionStatus.PENDING], owners=owners))
    if pending:
        checked = ids.payload if len(pending) == len(ids) else payload(dialect, pending)
        not_ready = await _NOT_READY.scalars(conn, {"ids": checked})
        pending -= {SessionId(sid) for sid in not_ready}
    return pending


async def _commit_batch(
    conn: AsyncConnection,
    dialect: Dialect,
    batch: Sequence[SessionPlacement],
    now: datetime,
    locked: IdBatch,
    ready: set[SessionId],
    ledger: Ledger,
    taken: dict[AgentId, dict[str, int]],
    outcome: PlacementOutcome,
) -> None:
    """Write one batch: sessions and kernels SCHEDULED, with history; slots into `taken`.

    Only sessions in `ready` (the placeable ones of those `locked`) are written, those whose
    kernels fit what `ledger` has left; the batch's slots are counted into `ledger` (what later
    batches fit into) and `taken` (written by the caller once, for all batches).
    """
    ids = [p.session_id for p in batch]
    outcome.stale.extend(sid for sid in ids if sid not in ready)
    claims = [Claim(p.session_id, p.kernels) for p in batch if p.session_id in ready]
    accepted, deltas = fit_claims(ledger, claims)
    for agent_id, slots in deltas.items():
        total = taken.setdefault(agent_id, {})
        for slot, amount in slots.items():
            ledger[agent_id][slot][1] += amount  # what later batches see as occupied
            total[slot] = total.get(slot, 0) + amount
    accepted_set = set(accepted)
    outcome.no_longer_fits.extend(
        p.session_id for p in batch if p.session_id in ready and p.session_id not in accepted_set
    )
    if not accepted:
        return

    # The ids are encoded once for every statement of the batch (reused from the lock when
    # they are the same sessions in the same order).
    accepted_ids = locked if tuple(accepted) == locked.values else id_batch(dialect, accepted)
    await record_session_history(
        conn,
        dialect,
        accepted_ids,
        phase=PHASE,
        result=SchedulingResult.SUCCESS.value,
        to_status=SessionStatus.SCHEDULED.value,
        now=now,
        moving=True,
    )
    await _SCHEDULE_SESSIONS.run(conn, {"ids": accepted_ids.payload, "now": now})
    placed_sessions = [p for p in batch if p.session_id in accepted_set]
    moved = await _place_kernels(conn, dialect, placed_sessions, accepted_ids, now)
    expected = sum(len(p.kernels) for p in placed_sessions)
    if moved != expected:
        # Every kernel was checked PENDING under lock above; a plan naming too few or
        # too many kernels of a session is a bug, and nothing of it may commit.
        raise RuntimeError(f"placement moved {moved} kernels, expected {expected}")
    await record_kernel_history(
        conn,
        dialect,
        accepted_ids,
        [KernelStatus.SCHEDULED.value],
        phase=PHASE,
        result=SchedulingResult.SUCCESS.value,
        to_status=KernelStatus.SCHEDULED.value,
        now=now,
        message="placed on ",
        message_names_agent=True,
        recorded_from=KernelStatus.PENDING.value,
    )
    outcome.placed.extend(accepted)


# The commit's other statements, built once (parameters: ids, now).
_USABLE_AGENTS = DirectStatement(
    lambda dialect: sa.select(agents.c.id).where(
        in_param(dialect, agents.c.id, "ids"),
        agents.c.status == AGENT_ALIVE,
        agents.c.schedulable.is_(True),
    )
)
_NOT_READY = DirectStatement(
    lambda dialect: (
        sa.select(kernels.c.session_id)
        .distinct()
        .where(
            in_param(dialect, kernels.c.session_id, "ids"),
            kernels.c.status != KernelStatus.PENDING.value,
        )
    )
)
_SCHEDULE_SESSIONS = DirectStatement(
    lambda dialect: (
        sessions.update()
        .where(in_param(dialect, sessions.c.id, "ids"))
        .values(
            status=SessionStatus.SCHEDULED.value,
            status_changed_at=sa.bindparam("now", type_=sessions.c.status_changed_at.type),
            status_info=None,
            phase=None,
            phase_attempts=0,
            **kernels_ready_on_move(
                SessionStatus.SCHEDULED,
                sa.bindparam("now", type_=sessions.c.status_changed_at.type),
            ),
        )
    )
)
