"""place_sessions: selectors, cluster sessions all or nothing, head-of-line, a reason for all."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from corral.domain.outcome import SessionResult
from corral.domain.resource_group import Ordering, ResourceGroupOptions, Selector
from corral.domain.session import PendingSession
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.scheduler import validators as v
from corral.scheduler.planner import NO_CAPACITY, WAITING_BEHIND, place_sessions
from corral.scheduler.types import AgentPool, DependencyState, Outcome, Plan
from tests.unit.scheduler._builders import CPU, cpu_pool, dependency, session, snapshot

PLACED, WAITING, BLOCKED, FAILED = Outcome.PLACED, Outcome.WAITING, Outcome.BLOCKED, Outcome.FAILED
STRICT, BEST_EFFORT = Ordering.STRICT, Ordering.BEST_EFFORT
S = SessionStatus


def _s(
    name: str,
    created: int,
    cpus: int = 1,
    *,
    slots: Mapping[str, int] | None = None,
    kernels: int = 1,
    mode: str = "single-node",
    owner: int = 1,
    priority: int = 0,
    failed_agents: Sequence[str] = (),
) -> PendingSession:
    """A session labelled `name`, created `created` s after T0, `kernels` kernels of `cpus` cpus."""
    return session(
        id=created + 1,
        name=name,
        created=created,
        slots=slots if slots is not None else {"cpu": cpus * CPU},
        kernels=kernels,
        mode=mode,
        owner=owner,
        priority=priority,
        failed_agents=failed_agents,
    )


def _plan(
    pending: Sequence[PendingSession],
    agents: AgentPool,
    *,
    deps: Mapping[str, Sequence[DependencyState]] | None = None,
    **options: object,
) -> Plan:
    """Place `pending` on `agents` with the given group options (users may give any priority
    unless they say otherwise) and dependencies by name."""
    by_name = {s.name: s.id for s in pending}
    return place_sessions(
        snapshot(
            pending=pending,
            agents=agents,
            options=ResourceGroupOptions.model_validate({"max_user_priority": 100, **options}),
            dependencies={by_name[n]: list(d) for n, d in (deps or {}).items()},
        )
    )


def _names(pending: Sequence[PendingSession]) -> dict[SessionId, str]:
    return {s.id: str(s.name) for s in pending}


def _outcomes(plan: Plan, pending: Sequence[PendingSession]) -> dict[str, tuple[Outcome, str]]:
    names = _names(pending)
    return {names[sid]: (d.outcome, d.code) for sid, d in plan.decisions.items()}


def _agents_of(plan: Plan, pending: Sequence[PendingSession]) -> dict[str, list[str]]:
    names = _names(pending)
    return {names[p.session_id]: [str(k.agent_id) for k in p.kernels] for p in plan.placements}


# --- selectors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param(Selector.CONCENTRATED, ["a", "a", "c", "c"], id="concentrated-packs"),
        pytest.param(Selector.DISPERSED, ["b", "b", "c", "b"], id="dispersed-spreads"),
        pytest.param(Selector.ROUNDROBIN, ["a", "b", "c", "a"], id="roundrobin-wraps"),
    ],
)
def test_each_selector_places_sessions_by_its_rule(selector: Selector, expected: list[str]) -> None:
    """Pack fills the fullest agent that fits, spread the emptiest, round-robin takes turns."""
    pending = [_s(f"s{i}", i) for i in range(4)]
    plan = _plan(pending, cpu_pool({"a": 2, "b": 6, "c": 5}), selector=selector)
    agents = _agents_of(plan, pending)
    assert [agents[f"s{i}"][0] for i in range(4)] == expected


@pytest.mark.parametrize(
    ("free", "failed", "expected"),
    [
        pytest.param({"a": 2, "b": 8}, ["a"], "b", id="other-agent-first"),
        pytest.param({"a": 2, "b": 0}, ["a"], "a", id="failed-agent-when-nothing-else-fits"),
        pytest.param({"a": 2, "b": 8}, ["gone"], "a", id="agent-no-longer-in-group"),
    ],
)
def test_agents_that_failed_the_session_are_tried_last(
    free: dict[str, int], failed: list[str], expected: str
) -> None:
    """A session avoids agents it failed on before, but still uses one rather than wait."""
    pending = [_s("s", 0, failed_agents=failed)]
    assert _agents_of(_plan(pending, cpu_pool(free)), pending) == {"s": [expected]}


@pytest.mark.parametrize(
    ("usable", "message"),
    [
        pytest.param(["a"], "no agent has room now for cpu=4 on one agent", id="some-usable"),
        pytest.param([], "no agent of resource group 'default' is available now", id="none"),
    ],
)
def test_only_usable_agents_take_sessions(usable: list[str], message: str) -> None:
    """A session that only a lost or drained agent has room for waits for capacity."""
    pending = [_s("s", 0, cpus=4)]
    plan = _plan(pending, cpu_pool({"a": 2, "drained": 8}, usable=usable))
    decision = plan.decisions[pending[0].id]
    assert (decision.outcome, decision.code) == (WAITING, NO_CAPACITY)
    assert decision.message.startswith(message)
    assert plan.placements == []


# --- cluster sessions, all or nothing ------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "free", "expected"),
    [
        pytest.param("single-node", {"a": 3, "b": 4}, ["b", "b"], id="single-node-one-agent"),
        pytest.param("single-node", {"a": 3, "b": 3}, None, id="single-node-never-splits"),
        pytest.param("multi-node", {"a": 3, "b": 4}, ["a", "b"], id="multi-node-distinct"),
        pytest.param("multi-node", {"a": 4, "b": 1}, ["a", "a"], id="multi-node-shares-if-short"),
        pytest.param("multi-node", {"a": 1, "b": 1}, None, id="multi-node-does-not-fit"),
    ],
)
def test_cluster_sessions_place_all_kernels_or_none(
    mode: str, free: dict[str, int], expected: list[str] | None
) -> None:
    """Single-node sums kernels on one agent; multi-node spreads them, one agent each if it can."""
    pending = [_s("s", 0, kernels=2, slots={"cpu": 2 * CPU}, mode=mode)]
    plan = _plan(pending, cpu_pool(free))
    assert _agents_of(plan, pending).get("s") == expected
    if expected is None:
        assert _outcomes(plan, pending)["s"] == (WAITING, NO_CAPACITY)
    else:
        placement = plan.placements[0]
        assert [k.cluster_index for k in placement.kernels] == [0, 1]
        assert [k.slots for k in placement.kernels] == list(pending[0].kernel_slots)


@pytest.mark.parametrize("mode", ["single-node", "multi-node"])
def test_a_session_that_does_not_fit_leaves_capacity_to_later_ones(mode: str) -> None:
    """Nothing of an unplaced cluster session is kept: later sessions see the whole free space."""
    big = _s("big", 0, kernels=3, slots={"cpu": 2 * CPU}, mode=mode)
    pending = [big, _s("x", 1, cpus=2), _s("y", 2, cpus=2)]
    plan = _plan(pending, cpu_pool({"a": 2, "b": 2}, capacity=6), ordering=BEST_EFFORT)
    assert _outcomes(plan, pending) == {
        "big": (WAITING, NO_CAPACITY),
        "x": (PLACED, ""),
        "y": (PLACED, ""),
    }
    assert sorted(a for agents in _agents_of(plan, pending).values() for a in agents) == ["a", "b"]


# --- the head-of-line rule -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ordering", "small"),
    [
        pytest.param(STRICT, (BLOCKED, WAITING_BEHIND), id="strict-blocks"),
        pytest.param(BEST_EFFORT, (PLACED, ""), id="best-effort-passes"),
    ],
)
def test_a_session_short_of_capacity_holds_back_later_ones_under_strict_ordering(
    ordering: Ordering, small: tuple[Outcome, str]
) -> None:
    """Strict: sessions behind one that does not fit wait; best effort: smaller ones pass it."""
    pending = [_s("first", 0, cpus=2), _s("head", 1, cpus=6), _s("small", 2), _s("tiny", 3)]
    plan = _plan(pending, cpu_pool({"a": 4}, capacity=8), ordering=ordering)
    assert _outcomes(plan, pending) == {
        "first": (PLACED, ""),
        "head": (WAITING, NO_CAPACITY),
        "small": small,
        "tiny": small,
    }
    if ordering is STRICT:
        message = plan.decisions[pending[2].id].message
        assert message.startswith("waiting behind session head (")
        assert "resource group 'default'" in message


DEP = 0xDEAD  # the session the dependants wait for
FAILING = {v.DEPENDENCY_FAILED, v.REQUEST_TOO_LARGE, v.UNKNOWN_SLOT}


@pytest.mark.parametrize(
    ("head", "deps", "options", "code"),
    [
        pytest.param(
            {"cpus": 6}, [dependency(DEP, S.RUNNING)], {}, v.DEPENDENCY_PENDING, id="dep-pending"
        ),
        pytest.param(
            {"cpus": 6}, [dependency(DEP, S.ERROR)], {}, v.DEPENDENCY_FAILED, id="dep-missing"
        ),
        pytest.param({"cpus": 9}, [], {}, v.REQUEST_TOO_LARGE, id="never-fits"),
        pytest.param({"slots": {"tpu": 1}}, [], {}, v.UNKNOWN_SLOT, id="unknown-slot"),
        pytest.param(
            {"cpus": 6, "owner": 2},
            [],
            {"max_sessions_per_owner": 1},
            v.OWNER_SESSION_LIMIT,
            id="owner-limit",
        ),
    ],
)
def test_a_session_specific_reason_does_not_stop_the_pass(
    head: dict[str, object],
    deps: list[DependencyState],
    options: dict[str, object],
    code: str,
) -> None:
    """A dependency, an owner limit or a permanent failure never holds back later sessions."""
    pending = [_s("held", 0, owner=2), _s("head", 1, **head), _s("next", 2)]
    plan = _plan(
        pending, cpu_pool({"a": 4}, capacity=8), deps={"head": deps}, ordering=STRICT, **options
    )
    outcomes = _outcomes(plan, pending)
    assert outcomes["head"][1] == code
    assert outcomes["head"][0] is (FAILED if code in FAILING else WAITING)
    assert outcomes["next"] == (PLACED, "")


def test_sessions_behind_a_blocked_head_keep_their_own_reasons() -> None:
    """Behind a blocker, own waits and permanent failures are reported, not 'waiting behind'."""
    pending = [
        _s("head", 0, cpus=6),
        _s("dep-running", 1),
        _s("dep-missing", 2),
        _s("too-large", 3, cpus=9),
        _s("plain", 4),
    ]
    plan = _plan(
        pending,
        cpu_pool({"a": 4}),
        deps={"dep-running": [dependency(DEP, S.RUNNING)], "dep-missing": [dependency(DEP, None)]},
    )
    assert _outcomes(plan, pending) == {
        "head": (WAITING, NO_CAPACITY),
        "dep-running": (WAITING, v.DEPENDENCY_PENDING),
        "dep-missing": (FAILED, v.DEPENDENCY_MISSING),
        "too-large": (FAILED, v.REQUEST_TOO_LARGE),
        "plain": (BLOCKED, WAITING_BEHIND),
    }


def test_higher_priority_blocks_lower_priority_under_strict_ordering() -> None:
    """The order is priority first: a high-priority session short of room holds back older ones."""
    pending = [_s("old-low", 0), _s("new-high", 5, cpus=6, priority=1)]
    plan = _plan(pending, cpu_pool({"a": 4}))
    assert plan.order == [pending[1].id, pending[0].id]
    assert _outcomes(plan, pending)["old-low"] == (BLOCKED, WAITING_BEHIND)


def test_a_session_its_group_no_longer_admits_holds_nobody_back() -> None:
    """Under strict ordering, a high-priority session above max_user_priority waits for itself
    while the rest of the queue is placed."""
    pending = [_s("raised", 0, priority=50), _s("plain", 1)]
    plan = _plan(pending, cpu_pool({"a": 4}), max_user_priority=0)
    assert plan.order == [pending[0].id, pending[1].id]
    assert _outcomes(plan, pending) == {
        "raised": (WAITING, v.PRIORITY_NOT_ALLOWED),
        "plain": (PLACED, ""),
    }


# --- dependencies and owner limits within one pass -------------------------------------------


@pytest.mark.parametrize(
    ("status", "result", "expected"),
    [
        pytest.param(S.TERMINATED, SessionResult.SUCCESS, (PLACED, ""), id="succeeded"),
        pytest.param(S.RUNNING, None, (WAITING, v.DEPENDENCY_PENDING), id="running"),
        pytest.param(S.PENDING, None, (WAITING, v.DEPENDENCY_PENDING), id="pending"),
        pytest.param(S.ERROR, None, (FAILED, v.DEPENDENCY_FAILED), id="error"),
        pytest.param(
            S.TERMINATED, SessionResult.FAILURE, (FAILED, v.DEPENDENCY_FAILED), id="failed"
        ),
    ],
)
def test_dependencies_gate_placement(
    status: SessionStatus, result: str | None, expected: tuple[Outcome, str]
) -> None:
    """A failed dependency fails the session, a running one makes it wait, a success lets it run."""
    pending = [_s("s", 0)]
    plan = _plan(pending, cpu_pool({"a": 8}), deps={"s": [dependency(DEP, status, result)]})
    assert _outcomes(plan, pending) == {"s": expected}
    assert len(plan.placements) == (1 if expected[0] is PLACED else 0)


def test_owner_limit_counts_sessions_placed_earlier_in_the_same_pass() -> None:
    """The per-owner session limit sees this pass's placements; other owners go on."""
    pending = [_s("a1", 0, owner=1), _s("a2", 1, owner=1), _s("b1", 2, owner=2)]
    plan = _plan(pending, cpu_pool({"a": 8}), max_sessions_per_owner=1)
    assert _outcomes(plan, pending) == {
        "a1": (PLACED, ""),
        "a2": (WAITING, v.OWNER_SESSION_LIMIT),
        "b1": (PLACED, ""),
    }


# --- a decision for every candidate -----------------------------------------------------------


@pytest.mark.parametrize("ordering", [STRICT, BEST_EFFORT])
def test_every_candidate_gets_one_decision_at_its_position(ordering: Ordering) -> None:
    """Decisions cover the order exactly, 1-based; each one not placed says why."""
    pending = [
        _s("p", 0),
        _s("head", 1, cpus=7),
        _s("dep", 2),
        _s("never", 3, cpus=20),
        _s("q", 4),
    ]
    plan = _plan(
        pending, cpu_pool({"a": 4}), deps={"dep": [dependency(DEP, S.RUNNING)]}, ordering=ordering
    )
    assert sorted(plan.order) == sorted(s.id for s in pending)
    assert list(plan.decisions) == plan.order
    for position, sid in enumerate(plan.order, start=1):
        decision = plan.decisions[sid]
        assert (decision.session_id, decision.position) == (sid, position)
        if decision.outcome is not PLACED:
            assert decision.code
            assert decision.message
    assert {p.session_id for p in plan.placements} == {
        sid for sid, d in plan.decisions.items() if d.outcome is PLACED
    }


def test_no_pending_sessions_gives_an_empty_plan() -> None:
    """Nothing to place: no placements, no decisions, no order."""
    assert _plan([], cpu_pool({"a": 1})) == Plan()


def test_a_group_without_agents_makes_every_session_wait_without_blocking() -> None:
    """Before any agent joins, each session waits for agents; none is reported as blocked."""
    pending = [_s("s1", 0), _s("s2", 1)]
    plan = _plan(pending, AgentPool.empty())
    assert _outcomes(plan, pending) == {
        "s1": (WAITING, v.NO_AGENTS),
        "s2": (WAITING, v.NO_AGENTS),
    }


@pytest.mark.parametrize(("first", "sizes"), [(1, [1, 2, 4, 3]), (4, [4, 6]), (20, [10])])
def test_placements_are_handed_over_in_growing_batches_as_they_are_made(
    first: int, sizes: list[int]
) -> None:
    """Batches of `first`, then twice the last, then the rest: exactly the plan's placements."""
    pending = [_s(f"s{i}", i) for i in range(10)] + [_s("too-big", 10, cpus=99)]
    batches: list[list[object]] = []
    made = place_sessions(
        snapshot(pending=pending, agents=cpu_pool({"a": 8, "b": 8}, capacity=8)),
        on_batch=lambda batch: batches.append(list(batch)),
        first_batch=first,
    )
    assert [len(b) for b in batches] == sizes
    assert [p for b in batches for p in b] == made.placements
