"""Store properties (hypothesis): guarded changes follow the tables, slot accounting is exact."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from corral.domain.lifecycle import IllegalTransitionError, TransitionTable
from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.session import MilliSlots
from corral.domain.status import (
    KERNEL_TERMINAL,
    KERNEL_TRANSITIONS,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store._sql import in_values
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.placements import PlacementOutcome, SessionPlacement, commit_placements
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from corral.store.tables import agent_slots, kernel_history, kernels, session_history, sessions
from tests.integration.store._factories import (
    CANCEL,
    MARK_TERMINATING,
    NOW,
    PREPARE,
    RELEASE,
    TERMINATE,
    add_agents,
    add_sessions,
    add_user,
    assert_kernels_follow_sessions,
    assert_slots_consistent,
    on,
    placement,
)

S = SessionStatus
K = KernelStatus

# Every example shares the test's database, so each one creates fresh ids and reads only those.
# No explain phase: it replays a failure hundreds of times against the database.
PROPERTY = settings(
    max_examples=30,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --- 1. guarded status changes only ever follow the transition tables -----------------------


@dataclasses.dataclass
class StatusModel:
    """What `apply` should do, computed independently of the store."""

    sessions: dict[SessionId, SessionStatus]
    kernels: dict[KernelId, tuple[SessionId, KernelStatus, AgentId | None, MilliSlots | None]]
    # what the current batch did: sessions past their guard, sessions stopped by it, kernels moved
    touched: set[SessionId] = dataclasses.field(default_factory=set)
    stale: set[SessionId] = dataclasses.field(default_factory=set)
    kernels_moved: int = 0

    def apply(self, batch: Sequence[StatusChange]) -> None:
        self.touched, self.stale, self.kernels_moved = set(), set(), 0
        for change in batch:
            self._apply_one(change)

    def _apply_one(self, change: StatusChange) -> None:
        target = change.target or TransitionStatus()
        passing = [
            sid
            for sid in dict.fromkeys(change.session_ids)
            if self.sessions[sid] in change.expected
        ]
        self.touched |= set(passing)
        self.stale |= set(change.session_ids) - set(passing)
        for sid in passing:
            self.sessions[sid] = target.session or self.sessions[sid]
        to = target.kernel
        if to is None:
            return
        for kid, (sid, status, agent, slots) in list(self.kernels.items()):
            if sid in passing and status in KERNEL_TRANSITIONS.sources(to):
                gives_back = to is K.PENDING or to in KERNEL_TERMINAL
                self.kernels_moved += 1
                self.kernels[kid] = (
                    sid,
                    to,
                    None if to is K.PENDING else agent,
                    None if gives_back else slots,
                )


def draw_change(data: st.DataObject, model: StatusModel, ids: list[SessionId]) -> StatusChange:
    """A change that is legal (guided by current statuses, or random) or possibly illegal."""
    chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids) + 1))
    mode = data.draw(st.sampled_from(["guided", "guided", "random", "unchecked"]))
    everything = st.frozensets(st.sampled_from(list(S)), min_size=1)
    session_target: SessionStatus | None
    expected: frozenset[SessionStatus]
    live = sorted({model.sessions[sid] for sid in chosen} - SESSION_TRANSITIONS.terminal)
    if mode == "guided" and live:
        source = data.draw(st.sampled_from(live))
        session_target = data.draw(st.sampled_from(sorted(SESSION_TRANSITIONS.targets(source))))
        pool = sorted(SESSION_TRANSITIONS.sources(session_target) | {session_target})
        expected = frozenset({source}) | data.draw(st.frozensets(st.sampled_from(pool)))
        kernel_target = data.draw(
            st.sampled_from([K(session_target.value), None]) | st.sampled_from(list(K))
        )
    else:
        session_target = data.draw(st.none() | st.sampled_from(list(S)))
        kernel_target = data.draw(st.none() | st.sampled_from(list(K)))
        if session_target is None or mode == "unchecked":
            expected = data.draw(everything)
        else:
            pool = sorted(SESSION_TRANSITIONS.sources(session_target) | {session_target})
            expected = data.draw(st.frozensets(st.sampled_from(pool), min_size=1))
    target = TransitionStatus(session_target, kernel_target)
    return StatusChange(
        session_ids=chosen,
        phase=data.draw(st.sampled_from(["PrepareSessions", "StartSessions", "Reconcile"])),
        result=data.draw(st.sampled_from(list(SchedulingResult))),
        expected=expected,
        target=None if target == TransitionStatus() and data.draw(st.booleans()) else target,
        count_attempt=data.draw(st.booleans()),
    )


async def snapshot(db: Database, ids: Collection[SessionId]) -> list[Any]:
    """Every stored row about these sessions and the ledger, to prove nothing was written."""
    rows: list[Any] = []
    async with db.read() as conn:
        for table, key in (
            (sessions, sessions.c.id),
            (kernels, kernels.c.session_id),
            (session_history, session_history.c.session_id),
            (kernel_history, kernel_history.c.session_id),
            (agent_slots, None),
        ):
            query = sa.select(table)
            if key is not None:
                query = query.where(in_values(db.dialect, key, ids))
            rows.append(sorted(map(tuple, await conn.execute(query)), key=repr))
    return rows


async def assert_history_is_a_legal_path(
    db: Database,
    table: sa.Table,
    transitions: TransitionTable[Any],
    current: Mapping[Any, Any],
    ids: Collection[SessionId],
) -> None:
    """Each entity's history rows chain from the initial status to `current` along table edges."""
    key = table.c.session_id if table is session_history else table.c.kernel_id
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(key, table.c.from_status, table.c.to_status)
            .where(in_values(db.dialect, table.c.session_id, ids))
            .order_by(table.c.id)
        )
        chains: dict[Any, list[tuple[str, str]]] = defaultdict(list)
        for entity, source, target in rows:
            chains[entity].append((source, target))
    assert set(chains) <= set(current)
    for entity, status in current.items():
        assert status in transitions.reachable(transitions.initial)
        chain = chains.get(entity, [])
        statuses = [transitions.initial.value] + [to for _, to in chain]
        assert [source for source, _ in chain] == statuses[:-1], f"{entity}: broken chain"
        assert statuses[-1] == status.value
        for source, to in chain:
            if source != to:
                assert transitions.allowed(transitions.enum(source), transitions.enum(to))


@PROPERTY
@given(data=st.data())
async def test_guarded_changes_only_follow_the_transition_tables(
    db: Database, data: st.DataObject
) -> None:
    """Random guarded applies move sessions and kernels only along table edges, as modelled."""
    repo = SessionRepository(db)
    owner = await add_user(db)
    agents = await add_agents(db, [{"cpu": 100_000, "mem": 100_000}] * 2)
    agent_ids = sorted(agents)
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=2, max_size=5))
    created = await add_sessions(db, owner, [(n, {"cpu": 1000, "mem": 500}) for n in sizes])
    ids = [s.id for s in created]
    to_place = data.draw(st.sets(st.sampled_from(ids)))
    plan = [
        placement(s, [data.draw(st.sampled_from(agent_ids)) for _ in s.kernels])
        for s in created
        if s.id in to_place
    ]
    outcome = await commit_placements(db, plan, NOW)
    assert sorted(outcome.placed) == sorted(to_place)
    placed = {
        (p.session_id, k.cluster_index): (k.agent_id, k.slots) for p in plan for k in p.kernels
    }
    model = StatusModel(
        sessions={s.id: S.SCHEDULED if s.id in to_place else S.PENDING for s in created},
        kernels={
            k.id: (s.id, K.SCHEDULED, *placed[s.id, k.cluster_index])
            if (s.id, k.cluster_index) in placed
            else (s.id, K.PENDING, None, None)
            for s in created
            for k in s.kernels
        },
    )

    for step in range(data.draw(st.integers(1, 6))):
        now = NOW + timedelta(seconds=step + 1)
        batch = [draw_change(data, model, ids) for _ in range(data.draw(st.integers(1, 3)))]
        try:
            for change in batch:
                change.validate()
        except IllegalTransitionError:
            before = await snapshot(db, ids)
            with pytest.raises(IllegalTransitionError):
                await repo.apply(batch, now)
            assert await snapshot(db, ids) == before
            continue
        applied = await repo.apply(batch, now)
        model.apply(batch)
        assert (set(applied.sessions), applied.stale) == (model.touched, model.stale)
        assert applied.kernels_moved == model.kernels_moved
        found = await assert_slots_consistent(db, agents, ids)
        assert {s.id: s.status for s in found} == model.sessions
        assert {
            k.id: (s.id, k.status, k.agent_id, k.occupied_slots) for s in found for k in s.kernels
        } == model.kernels

    await assert_history_is_a_legal_path(
        db, session_history, SESSION_TRANSITIONS, model.sessions, ids
    )
    kernel_statuses = {kid: status for kid, (_, status, _, _) in model.kernels.items()}
    await assert_history_is_a_legal_path(
        db, kernel_history, KERNEL_TRANSITIONS, kernel_statuses, ids
    )


# --- 2. slot accounting through placement, release and termination ---------------------------

# Some kernels ask for a slot some agents lack (capacity 0) or have none of at all.
kernel_slots = st.fixed_dictionaries(
    {"cpu": st.integers(0, 4000)},
    optional={"mem": st.integers(0, 8000), "gpu": st.integers(0, 1000)},
)
agent_capacity = st.fixed_dictionaries(
    {"cpu": st.integers(1, 16_000)},
    optional={"mem": st.integers(0, 32_000), "gpu": st.integers(0, 2000)},
)


def expected_outcome(
    plan: Sequence[SessionPlacement],
    statuses: Mapping[SessionId, SessionStatus],
    ledger: Mapping[AgentId, Mapping[str, list[int]]],
) -> PlacementOutcome:
    """Sessions in plan order, each placed whole if it fits what is still free, else not at all."""
    free = {
        (a, slot): cap - occ for a, slots in ledger.items() for slot, (cap, occ) in slots.items()
    }
    outcome = PlacementOutcome()
    for p in plan:
        if statuses[p.session_id] is not S.PENDING:
            outcome.stale.append(p.session_id)
            continue
        need: Counter[tuple[AgentId, str]] = Counter()
        for k in p.kernels:
            need.update({(k.agent_id, slot): v for slot, v in k.slots.items() if v})
        if all(free.get(cell, 0) >= amount for cell, amount in need.items()):
            outcome.placed.append(p.session_id)
            for cell, amount in need.items():
                free[cell] -= amount
        else:
            outcome.no_longer_fits.append(p.session_id)
    return outcome


@PROPERTY
@given(data=st.data())
async def test_slot_accounting_stays_exact_through_place_release_and_terminate(
    db: Database, data: st.DataObject
) -> None:
    """Occupancy stays within [0, capacity], equals what kernels hold, and ends at zero."""
    repo = SessionRepository(db)
    owner = await add_user(db)
    agents = await add_agents(db, data.draw(st.lists(agent_capacity, min_size=1, max_size=4)))
    agent_ids = sorted(agents)
    shapes = data.draw(st.lists(st.tuples(st.integers(1, 3), kernel_slots), min_size=1, max_size=6))
    created = await add_sessions(db, owner, shapes)
    ids = [s.id for s in created]

    for step in range(data.draw(st.integers(1, 8))):
        now = NOW + timedelta(seconds=step + 1)
        chosen = data.draw(st.lists(st.sampled_from(created), min_size=1, unique_by=lambda s: s.id))
        chosen_ids = [s.id for s in chosen]
        op = data.draw(st.sampled_from(["place", "place", "prepare", "release", "mark", "end"]))
        if op == "place":
            plan = [
                placement(s, [data.draw(st.sampled_from(agent_ids)) for _ in s.kernels])
                for s in chosen
            ]
            statuses = {s.id: s.status for s in await repo.get(chosen_ids)}
            expected = expected_outcome(plan, statuses, await read_ledger(db))
            assert await commit_placements(db, plan, now) == expected
        elif op == "prepare":
            await repo.apply([on(PREPARE, chosen_ids)], now)
        elif op == "release":
            await repo.apply([on(RELEASE, chosen_ids)], now)
        elif op == "mark":
            await repo.apply([on(MARK_TERMINATING, chosen_ids)], now)
        else:
            await repo.apply([on(CANCEL, chosen_ids), on(TERMINATE, chosen_ids)], now)
        assert_kernels_follow_sessions(await assert_slots_consistent(db, agents, ids))

    end = NOW + timedelta(hours=1)
    await repo.apply([on(c, ids) for c in (CANCEL, MARK_TERMINATING, TERMINATE)], end)
    found = await assert_slots_consistent(db, agents, ids)
    assert all(s.status in SESSION_TRANSITIONS.terminal for s in found)
    ledger = await read_ledger(db)
    assert all(occupied == 0 for a in agents for _, occupied in ledger[a].values())
