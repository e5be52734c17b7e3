"""place_sessions on random pools and sessions: invariants every plan must keep."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.outcome import SessionResult
from corral.domain.resource_group import (
    Ordering,
    ResourceGroupOptions,
    Selector,
    Sequencer,
)
from corral.domain.session import PendingSession
from corral.domain.slots import ResourceSlots
from corral.domain.status import SessionStatus
from corral.scheduler.planner import NO_CAPACITY, WAITING_BEHIND, place_sessions
from corral.scheduler.types import AgentPool, GroupSnapshot, Int64Array, Outcome, Plan
from tests.unit.scheduler._builders import (
    CPU,
    GIB,
    dependency,
    pool,
    session,
    snapshot,
    usage,
)

SLOTS = ("cpu", "mem", "gpu")
UNIT = {"cpu": CPU, "mem": GIB, "gpu": 1000}
PROPERTIES = settings(max_examples=200, deadline=None)


# Strategies are built once: a fresh strategy object per draw costs hypothesis far more time.
_AGENTS = st.integers(1, 12)
_SLOT_COUNT = st.integers(1, 3)
_CLUSTER_SIZE = st.integers(1, 4)
_OWNER = st.integers(1, 3)
_PRIORITY = st.integers(0, 2)
_CREATED = st.integers(0, 20)
_MODE = st.sampled_from(["single-node", "multi-node"])
_SESSIONS = st.integers(0, 10)
_ONE_IN_FOUR = st.integers(0, 3).map(lambda n: n == 0)
_HELD_SESSIONS = st.integers(0, 2)
_HELD_CPUS = st.integers(0, 8)
_SESSION_LIMIT = st.integers(1, 3)
_SLOT_LIMIT = st.integers(1, 12).map(lambda n: ResourceSlots({"cpu": n}))
_DEPENDENCY = st.sampled_from(
    [
        (SessionStatus.RUNNING, None),
        (SessionStatus.TERMINATED, SessionResult.SUCCESS),
        (SessionStatus.TERMINATED, SessionResult.FAILURE),
    ]
)
_SEQUENCER = st.sampled_from(list(Sequencer))
_SELECTOR = st.sampled_from(list(Selector))
_ORDERING = st.sampled_from(list(Ordering))
# One draw per vector of per-slot amounts (0..base-1 units per slot): `_digits` decodes it.
_AMOUNTS = {(base, k): st.integers(0, base**k - 1) for base in (4, 9) for k in (1, 2, 3)}
_MASKS = {n: st.integers(0, 2**n - 1) for n in range(1, 14)}


def _digits(value: int, base: int, count: int) -> list[int]:
    return [value // base**i % base for i in range(count)]


def _bits(value: int, count: int) -> list[bool]:
    return [bool(value >> i & 1) for i in range(count)]


def _draw_agents(draw: st.DrawFn) -> AgentPool:
    """1-12 agents over 1-3 slots, random capacity and occupancy, about one in four unusable."""
    names = SLOTS[: draw(_SLOT_COUNT)]
    count, k = draw(_AGENTS), len(names)
    capacity: dict[str, dict[str, int]] = {}
    occupied: dict[str, dict[str, int]] = {}
    for i in range(count):
        units = _digits(draw(_AMOUNTS[9, k]), 9, k)
        held = [
            h % (u + 1) for h, u in zip(_digits(draw(_AMOUNTS[9, k]), 9, k), units, strict=True)
        ]
        capacity[f"a{i}"] = {n: u * UNIT[n] for n, u in zip(names, units, strict=True)}
        occupied[f"a{i}"] = {n: h * UNIT[n] for n, h in zip(names, held, strict=True)}
    # An agent is unusable when both of its bits are set: one in four.
    down = draw(_MASKS[count]) & draw(_MASKS[count])
    usable = [a for a, off in zip(capacity, _bits(down, count), strict=True) if not off]
    return pool(capacity, occupied=occupied, usable=usable)


def _draw_session(draw: st.DrawFn, n: int, agents: AgentPool) -> PendingSession:
    """Session `n`: random owner, priority, age, 1-4 kernels (equal or not), some failed agents."""
    names, k = agents.slot_names, len(agents.slot_names)
    size = draw(_CLUSTER_SIZE)

    def amounts() -> dict[str, int]:
        units = _digits(draw(_AMOUNTS[4, k]), 4, k)
        return {name: u * UNIT[name] for name, u in zip(names, units, strict=True)}

    per_kernel = [amounts()] * size if draw(st.booleans()) else [amounts() for _ in range(size)]
    failed: list[str] = []
    if draw(_ONE_IN_FOUR):
        candidates = [*agents.ids, "gone"]  # an agent that left the group since
        picked = _bits(draw(_MASKS[len(candidates)]), len(candidates))
        failed = [a for a, hit in zip(candidates, picked, strict=True) if hit]
    return session(
        id=n,
        owner=draw(_OWNER),
        priority=draw(_PRIORITY),
        created=draw(_CREATED),
        per_kernel=per_kernel,
        mode=draw(_MODE),
        failed_agents=failed,
    )


@st.composite
def _snapshots(draw: st.DrawFn) -> GroupSnapshot:
    """A group with random pending sessions, owners' holdings, dependencies and options."""
    agents = _draw_agents(draw)
    pending = [_draw_session(draw, n, agents) for n in range(1, draw(_SESSIONS) + 1)]
    deps = {
        s.id: [dependency(1000 + i, *draw(_DEPENDENCY))]
        for i, s in enumerate(pending)
        if draw(_ONE_IN_FOUR)
    }
    held = {
        owner: usage(draw(_HELD_SESSIONS), {"cpu": draw(_HELD_CPUS) * CPU}) for owner in (1, 2, 3)
    }
    options = ResourceGroupOptions(
        sequencer=draw(_SEQUENCER),
        selector=draw(_SELECTOR),
        ordering=draw(_ORDERING),
        max_sessions_per_owner=draw(_SESSION_LIMIT) if draw(_ONE_IN_FOUR) else None,
        max_slots_per_owner=draw(_SLOT_LIMIT) if draw(_ONE_IN_FOUR) else None,
    )
    return snapshot(pending=pending, agents=agents, usage=held, dependencies=deps, options=options)


def _vector(slots: dict[str, int], agents: AgentPool) -> Int64Array:
    index = agents.slot_index
    vector = np.zeros(len(agents.slot_names), dtype=np.int64)
    for name, amount in slots.items():
        if amount:
            vector[index[name]] += amount
    return vector


def _apply(agents: AgentPool, plan: Plan) -> Int64Array:
    """The pool's free space after committing every placement of `plan`."""
    free = agents.free.copy()
    row = {agent: r for r, agent in enumerate(agents.ids)}
    for placement in plan.placements:
        for k in placement.kernels:
            free[row[k.agent_id]] -= _vector(k.slots, agents)
    return free


def _placed_in_order(
    snap: GroupSnapshot, plan: Plan
) -> Iterator[tuple[PendingSession, Outcome, str, Int64Array]]:
    """Replay the plan: each session in order, its outcome and code, and the free space it saw."""
    by_id = {s.id: s for s in snap.pending}
    placements = {p.session_id: p for p in plan.placements}
    row = {agent: r for r, agent in enumerate(snap.agents.ids)}
    free = snap.agents.free.copy()
    for sid in plan.order:
        decision = plan.decisions[sid]
        yield by_id[sid], decision.outcome, decision.code, free.copy()
        if sid in placements:
            for k in placements[sid].kernels:
                free[row[k.agent_id]] -= _vector(k.slots, snap.agents)


def _copies(free: Int64Array, need: Int64Array) -> Int64Array:
    """How many kernels of `need` each agent still holds (a large number for an empty need)."""
    wanted = need > 0
    if not wanted.any():
        return np.full(free.shape[0], 1 << 30, dtype=np.int64)
    copies: Int64Array = (free[:, wanted] // need[wanted]).min(axis=1)
    return copies


@PROPERTIES
@given(snap=_snapshots())
def test_placements_never_overcommit_and_use_usable_agents_only(snap: GroupSnapshot) -> None:
    """Committing the whole plan leaves no agent below zero in any slot; unusable ones untouched."""
    plan = place_sessions(snap)
    assert (_apply(snap.agents, plan) >= 0).all()
    usable = {a for a, ok in zip(snap.agents.ids, snap.agents.usable, strict=True) if ok}
    assert {k.agent_id for p in plan.placements for k in p.kernels} <= usable


@PROPERTIES
@given(snap=_snapshots())
def test_a_placed_session_has_every_kernel_placed_once(snap: GroupSnapshot) -> None:
    """Each kernel appears once with its own request; a single-node session uses one agent."""
    plan = place_sessions(snap)
    by_id = {s.id: s for s in snap.pending}
    for placement in plan.placements:
        s = by_id[placement.session_id]
        assert len(placement.kernels) == s.cluster_size
        assert [k.cluster_index for k in placement.kernels] == list(range(s.cluster_size))
        assert [k.slots for k in placement.kernels] == list(s.kernel_slots)
        if s.cluster_mode == "single-node":
            assert len({k.agent_id for k in placement.kernels}) == 1


@PROPERTIES
@given(snap=_snapshots())
def test_only_placed_sessions_take_capacity(snap: GroupSnapshot) -> None:
    """Free space drops by exactly the placed sessions' requests; the snapshot stays as read."""
    before = snap.agents.free.copy()
    plan = place_sessions(snap)
    assert np.array_equal(snap.agents.free, before)
    placed = [sid for sid in plan.order if plan.decisions[sid].outcome is Outcome.PLACED]
    assert [p.session_id for p in plan.placements] == placed
    by_id = {s.id: s for s in snap.pending}
    taken = sum(
        (_vector(by_id[sid].requested_total(), snap.agents) for sid in placed),
        np.zeros(len(snap.agents.slot_names), dtype=np.int64),
    )
    assert np.array_equal((before - _apply(snap.agents, plan)).sum(axis=0), taken)


@PROPERTIES
@given(snap=_snapshots())
def test_strict_ordering_places_nothing_behind_a_session_short_of_capacity(
    snap: GroupSnapshot,
) -> None:
    """Strict: nothing after the first no_capacity session is placed; best effort blocks none."""
    plan = place_sessions(snap)
    outcomes = [(plan.decisions[sid].outcome, plan.decisions[sid].code) for sid in plan.order]
    heads = [i for i, o in enumerate(outcomes) if o == (Outcome.WAITING, NO_CAPACITY)]
    blocked = [i for i, o in enumerate(outcomes) if o[0] is Outcome.BLOCKED]
    assert all(code == WAITING_BEHIND for outcome, code in outcomes if outcome is Outcome.BLOCKED)
    if snap.options.ordering is Ordering.BEST_EFFORT:
        assert blocked == []
        return
    first = heads[0] if heads else len(outcomes)
    assert all(outcome is not Outcome.PLACED for outcome, _ in outcomes[first:])
    assert all(i > first for i in blocked)


@PROPERTIES
@given(snap=_snapshots())
def test_every_candidate_gets_exactly_one_decision_in_order(snap: GroupSnapshot) -> None:
    """Order and decisions cover the candidates once; positions run 1..n; all but placed say why."""
    plan = place_sessions(snap)
    assert sorted(plan.order) == sorted(s.id for s in snap.pending)
    assert sorted(plan.decisions) == sorted(plan.order)
    assert [plan.decisions[sid].position for sid in plan.order] == list(
        range(1, len(plan.order) + 1)
    )
    for sid, decision in plan.decisions.items():
        assert decision.session_id == sid
        if decision.outcome is not Outcome.PLACED:
            assert decision.code
            assert decision.message


@PROPERTIES
@given(snap=_snapshots())
def test_no_capacity_is_only_reported_when_nothing_fits(snap: GroupSnapshot) -> None:
    """Replayed in order, a no_capacity session had no room; sharing, then failed agents, last.

    Checked where the rule is exact: single-node sessions, and multi-node ones whose kernels are
    all equal (greedy placement then fits as many kernels as the agents hold copies of one).
    """
    plan = place_sessions(snap)
    agents = snap.agents
    placements = {p.session_id: p for p in plan.placements}
    for s, outcome, code, free in _placed_in_order(snap, plan):
        needs = [_vector(slots, agents) for slots in s.kernel_slots]
        failed = np.isin(np.array(agents.ids, dtype=object), list(s.failed_agents))
        if s.cluster_mode == "single-node":
            total = sum(needs, np.zeros_like(needs[0]))
            fits = agents.usable & (free >= total).all(axis=1)
            if code == NO_CAPACITY:
                assert not fits.any()
            elif outcome is Outcome.PLACED:
                chosen = agents.ids.index(placements[s.id].kernels[0].agent_id)
                assert fits[chosen]
                assert not failed[chosen] or not (fits & ~failed).any()
            continue
        if any(not np.array_equal(n, needs[0]) for n in needs):
            continue  # unequal kernels: greedy placement is not exact (see test_selectors)
        copies = np.where(agents.usable, _copies(free, needs[0]), 0)
        if code == NO_CAPACITY:
            assert copies.sum() < len(needs)
        elif outcome is Outcome.PLACED:
            # Fresh healthy agents first, then sharing healthy ones, then fresh failed agents.
            distinct = {k.agent_id for k in placements[s.id].kernels}
            healthy_copies = int(copies[~failed].sum())
            healthy = int((copies[~failed] > 0).sum())
            fresh_failed = int((copies[failed] > 0).sum())
            kernels = len(needs)
            expected = (
                min(kernels, healthy)
                if kernels <= healthy_copies
                else healthy + min(kernels - healthy_copies, fresh_failed)
            )
            assert len(distinct) == expected


@PROPERTIES
@given(snap=_snapshots())
def test_placement_is_deterministic(snap: GroupSnapshot) -> None:
    """The same snapshot always gives the same plan."""
    assert place_sessions(snap) == place_sessions(snap)
