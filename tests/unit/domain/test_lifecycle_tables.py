"""The transition tables against spec document 1, and their invariants as properties."""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.domain import status
from corral.domain.lifecycle import IllegalTransitionError, TransitionTable
from corral.domain.results import TransitionStatus
from corral.domain.session import KernelIntent
from corral.domain.status import (
    ALL_TRANSITION_TABLES,
    ENDPOINT_TRANSITIONS,
    KERNEL_TRANSITIONS,
    ROUTE_TRANSITIONS,
    SESSION_TRANSITIONS,
    EndpointLifecycle,
    KernelStatus,
    RouteStatus,
    SessionStatus,
)

S = SessionStatus
K = KernelStatus
E = EndpointLifecycle
R = RouteStatus

# Written by hand from spec document 1's diagrams and handler tables, independently of
# status.py. NEED_RETRY "(maintain)" and a success target equal to the current status
# (PrepareSessions on PREPARING) change nothing, so they are not listed.
SPEC1_SESSION_EDGES: list[tuple[SessionStatus, SessionStatus, str]] = [
    (S.PENDING, S.SCHEDULED, "ScheduleNewSessions success"),
    (S.PENDING, S.CANCELLED, "ScheduleNewSessions expired/give_up"),
    (S.SCHEDULED, S.PREPARING, "PrepareSessions success"),
    (S.SCHEDULED, S.PENDING, "PrepareSessions expired/give_up"),
    (S.PREPARING, S.PENDING, "PrepareSessions expired/give_up"),
    (S.PREPARED, S.CREATING, "StartSessions success"),
    (S.PREPARED, S.PENDING, "StartSessions expired/give_up"),
    (S.CREATING, S.PENDING, "diagram: CREATING expired/give_up → PENDING"),
    (S.TERMINATING, S.TERMINATED, "TerminateSessions success/expired/give_up"),
    (S.SCHEDULED, S.PREPARED, "PromoteToPrepared"),
    (S.PREPARING, S.PREPARED, "PromoteToPrepared"),
    (S.CREATING, S.RUNNING, "PromoteToRunning"),
    (S.TERMINATING, S.TERMINATED, "PromoteToTerminated"),
    (S.RUNNING, S.TERMINATING, "DetectTermination (diagram: kernel failure)"),
]

_KERNEL_NON_TERMINAL = [
    K.PENDING,
    K.SCHEDULED,
    K.PREPARING,
    K.PULLING,
    K.PREPARED,
    K.CREATING,
    K.RUNNING,
    K.TERMINATING,
]

# Kernel edges implied by the handlers' kernel targets: each handler's TransitionStatus.kernel
# applied to the kernels its sessions can hold, plus the agent progress the promotion handlers'
# check_kernel_statuses wait for.
SPEC1_KERNEL_EDGES: list[tuple[KernelStatus, KernelStatus, str]] = [
    (K.PENDING, K.SCHEDULED, "ScheduleNewSessions success"),
    (K.PENDING, K.CANCELLED, "ScheduleNewSessions expired/give_up"),
    (K.SCHEDULED, K.PREPARING, "PrepareSessions success"),
    (K.SCHEDULED, K.PENDING, "PrepareSessions expired/give_up"),
    # A PREPARING session's kernels may be preparing, pulling or already prepared.
    (K.PREPARING, K.PENDING, "PrepareSessions expired/give_up"),
    (K.PULLING, K.PENDING, "PrepareSessions expired/give_up"),
    (K.PREPARED, K.PENDING, "PrepareSessions expired/give_up"),
    (K.PREPARED, K.CREATING, "StartSessions success"),
    (K.PREPARED, K.PENDING, "StartSessions expired/give_up"),
    (K.CREATING, K.PENDING, "diagram: CREATING expired/give_up → PENDING"),
    *(
        (kernel, K.TERMINATED, "TerminateSessions on non-terminal kernels")
        for kernel in _KERNEL_NON_TERMINAL
    ),
    # PromoteToPrepared waits for kernels to leave PENDING, SCHEDULED, PREPARING, PULLING.
    (K.PREPARING, K.PULLING, "PromoteToPrepared check set: PULLING follows PREPARING"),
    (K.PREPARING, K.PREPARED, "PromoteToPrepared check set"),
    (K.PULLING, K.PREPARED, "PromoteToPrepared check set"),
    # PromoteToRunning waits for kernels to leave PENDING..CREATING.
    (K.CREATING, K.RUNNING, "PromoteToRunning check set"),
    # DetectTermination catches a running kernel that finished or failed.
    (K.RUNNING, K.TERMINATED, "DetectTermination check set"),
    (K.RUNNING, K.ERROR, "DetectTermination check set (diagram: kernel failure)"),
]

SPEC1_ENDPOINT_EDGES: list[tuple[EndpointLifecycle, EndpointLifecycle, str]] = [
    (E.PENDING, E.SCALING, "CheckPendingDeployment success"),
    (E.CREATED, E.SCALING, "CheckPendingDeployment success"),
    (E.SCALING, E.READY, "ScalingDeployment success"),
    (E.READY, E.SCALING, "CheckReplicaDeployment success"),
    (E.READY, E.SCALING, "ReconcileDeployment failure"),
    (E.DESTROYING, E.DESTROYED, "DestroyingDeployment success/failure"),
    # The diagram's "(destroy request)" is a separate trigger; the spec names no source, so a
    # deployment may be destroyed from any live status.
    *(
        (source, E.DESTROYING, "diagram: destroy request")
        for source in (E.PENDING, E.CREATED, E.SCALING, E.READY, E.DEPLOYING)
    ),
]

SPEC1_ROUTE_EDGES: list[tuple[RouteStatus, RouteStatus, str]] = [
    (R.PROVISIONING, R.DEGRADED, "ProvisioningRoute success"),
    (R.PROVISIONING, R.FAILED_TO_START, "ProvisioningRoute failure"),
    (R.UNHEALTHY, R.HEALTHY, "HealthCheckRoute success"),
    (R.DEGRADED, R.HEALTHY, "HealthCheckRoute success"),
    (R.HEALTHY, R.UNHEALTHY, "HealthCheckRoute failure"),
    (R.DEGRADED, R.UNHEALTHY, "HealthCheckRoute failure"),
    (R.HEALTHY, R.DEGRADED, "HealthCheckRoute stale"),
    (R.UNHEALTHY, R.DEGRADED, "HealthCheckRoute stale"),
    (R.DEGRADED, R.TERMINATING, "RunningRoute failure"),
    (R.HEALTHY, R.TERMINATING, "RunningRoute failure"),
    (R.UNHEALTHY, R.TERMINATING, "RunningRoute failure"),
    (R.FAILED_TO_START, R.TERMINATING, "RunningRoute failure"),
    (R.UNHEALTHY, R.TERMINATING, "RouteEviction success"),
    (R.TERMINATING, R.TERMINATED, "TerminatingRoute success"),
]

SPEC1_EDGES: list[tuple[TransitionTable[Any], list[tuple[Any, Any, str]]]] = [
    (SESSION_TRANSITIONS, SPEC1_SESSION_EDGES),
    (KERNEL_TRANSITIONS, SPEC1_KERNEL_EDGES),
    (ENDPOINT_TRANSITIONS, SPEC1_ENDPOINT_EDGES),
    (ROUTE_TRANSITIONS, SPEC1_ROUTE_EDGES),
]

# Statuses no edge enters: CREATED is deprecated upstream in favour of READY, and DEPLOYING is
# reserved for rolling updates, which no spec handler performs yet.
# The tables differ in their enum type; tests handle them uniformly.
TABLES: list[TransitionTable[Any]] = list(ALL_TRANSITION_TABLES)

NEVER_ENTERED: dict[str, frozenset[Any]] = {
    "EndpointLifecycle": frozenset({E.CREATED}),
}

_TABLE_IDS = [table.name for table in TABLES]


def _spec_cases() -> list[Any]:
    return [
        pytest.param(table, source, target, f"{table.name}: {source.name} → {target.name} ({why})")
        for table, edges in SPEC1_EDGES
        for source, target, why in edges
    ]


@pytest.mark.parametrize(("table", "source", "target", "why"), _spec_cases())
def test_every_spec_transition_is_allowed(
    table: TransitionTable[Any], source: Enum, target: Enum, why: str
) -> None:
    """Each transition spec document 1 names is an edge of its table."""
    assert table.allowed(source, target), why


@pytest.mark.parametrize(
    ("table", "edges"), SPEC1_EDGES, ids=[table.name for table, _ in SPEC1_EDGES]
)
def test_every_edge_credited_to_spec1_is_in_spec1(
    table: TransitionTable[Any], edges: list[tuple[Any, Any, str]]
) -> None:
    """No edge claims spec document 1 as its rule unless the spec names it."""
    named = {(source, target) for source, target, _ in edges}
    credited = {(e.source, e.target) for e in table if e.rule == status.SPEC1}
    assert credited - named == set()


@pytest.mark.parametrize("table", TABLES, ids=_TABLE_IDS)
def test_every_edge_has_a_label_and_a_known_rule(table: TransitionTable[Any]) -> None:
    """Every edge says which handler or request takes it and which rule admits it."""
    for edge in table:
        assert edge.label.strip(), edge
        assert edge.rule in {status.SPEC1, status.SPEC2, status.DESIGN}, edge


def _table_and_status() -> st.SearchStrategy[tuple[TransitionTable[Any], Any]]:
    return st.sampled_from(TABLES).flatmap(
        lambda table: st.tuples(st.just(table), st.sampled_from(list(table.enum)))
    )


def _table_and_pair() -> st.SearchStrategy[tuple[TransitionTable[Any], Any, Any]]:
    return st.sampled_from(TABLES).flatmap(
        lambda table: st.tuples(
            st.just(table), st.sampled_from(list(table.enum)), st.sampled_from(list(table.enum))
        )
    )


@given(_table_and_status())
def test_every_status_can_reach_a_terminal_status(case: tuple[TransitionTable[Any], Any]) -> None:
    """No status is a trap: a terminal status is always reachable."""
    table, source = case
    assert table.reachable(source) & table.terminal


@given(_table_and_status())
def test_terminal_statuses_have_no_exits(case: tuple[TransitionTable[Any], Any]) -> None:
    """Terminal means final: a terminal status has no outgoing edge."""
    table, source = case
    if source in table.terminal:
        assert table.targets(source) == frozenset()
    else:
        assert table.targets(source)


@given(_table_and_pair())
def test_check_raises_exactly_when_not_allowed(
    case: tuple[TransitionTable[Any], Any, Any],
) -> None:
    """`check` and `allowed` agree on every (source, target) pair."""
    table, source, target = case
    if table.allowed(source, target):
        table.check(source, target)
    else:
        with pytest.raises(IllegalTransitionError) as raised:
            table.check(source, target)
        assert (raised.value.source, raised.value.target) == (source, target)


@given(st.sampled_from(TABLES), st.data())
def test_random_walks_stay_among_statuses_reachable_from_initial(
    table: TransitionTable[Any], data: st.DataObject
) -> None:
    """Walks from the initial status cover every status except the reserved never-entered ones.

    EndpointLifecycle.CREATED is deprecated upstream (READY replaced it) and DEPLOYING is
    reserved for rolling updates: both are accepted as sources, so rows written by older code
    can still move on, but no edge enters them, so a walk from PENDING never visits them.
    """
    never_entered = NEVER_ENTERED.get(table.name, frozenset())
    from_initial = table.reachable(table.initial)
    assert from_initial == frozenset(table.enum.__members__.values()) - never_entered
    current = table.initial
    for _ in range(data.draw(st.integers(min_value=0, max_value=50), label="steps")):
        if current in table.terminal:
            break
        current = data.draw(st.sampled_from(sorted(table.targets(current), key=str)))
        assert current in from_initial
        assert current not in never_entered


def test_reserved_endpoint_statuses_have_no_incoming_edges() -> None:
    """CREATED (deprecated) is never entered, only left."""
    for reserved in NEVER_ENTERED["EndpointLifecycle"]:
        assert ENDPOINT_TRANSITIONS.sources(reserved) == frozenset()
        assert ENDPOINT_TRANSITIONS.targets(reserved)


def test_rolling_updates_enter_and_leave_deploying() -> None:
    """DEPLOYING (rolling updates): entered from READY or SCALING, left to READY or DESTROYING."""
    assert ENDPOINT_TRANSITIONS.sources(E.DEPLOYING) == {E.READY, E.SCALING}
    assert ENDPOINT_TRANSITIONS.targets(E.DEPLOYING) == {E.READY, E.DESTROYING}


def test_enums_have_the_members_spec1_names() -> None:
    """The four enums hold exactly the statuses spec document 1 names, with its values."""
    session_names = [
        "PENDING",
        "SCHEDULED",
        "PREPARING",
        "PREPARED",
        "CREATING",
        "RUNNING",
        "TERMINATING",
        "TERMINATED",
        "CANCELLED",
        "ERROR",
    ]
    assert {m.name: m.value for m in SessionStatus} == {n: n for n in session_names}
    assert {m.name: m.value for m in KernelStatus} == {n: n for n in [*session_names, "PULLING"]}
    endpoint_values = ["pending", "created", "scaling", "ready", "deploying", "destroying"]
    assert {m.name: m.value for m in EndpointLifecycle} == {
        v.upper(): v for v in [*endpoint_values, "destroyed"]
    }
    route_values = ["provisioning", "healthy", "unhealthy", "degraded", "terminating"]
    assert {m.name: m.value for m in RouteStatus} == {
        v.upper(): v for v in [*route_values, "terminated", "failed_to_start"]
    }


def test_named_status_sets_match_the_promotion_handlers() -> None:
    """The sets the handlers filter on are the ones spec document 1's tables list."""
    assert frozenset({K.PENDING, K.SCHEDULED, K.PREPARING, K.PULLING}) == (
        status.KERNEL_NOT_YET_PREPARED
    )
    assert frozenset({K.PENDING, K.SCHEDULED, K.PREPARING, K.PULLING, K.PREPARED, K.CREATING}) == (
        status.KERNEL_NOT_YET_RUNNING
    )
    assert frozenset({S.TERMINATED, S.CANCELLED, S.ERROR}) == status.SESSION_TERMINAL
    assert frozenset({K.TERMINATED, K.CANCELLED, K.ERROR}) == status.KERNEL_TERMINAL
    assert frozenset(KernelStatus) - status.KERNEL_TERMINAL == status.KERNEL_NON_TERMINAL
    assert frozenset(SessionStatus) - status.SESSION_TERMINAL == status.SESSION_NON_TERMINAL


class _Light(StrEnum):
    RED = "RED"
    GREEN = "GREEN"
    OFF = "OFF"


def test_table_rejects_a_self_loop() -> None:
    """A status moving to itself is not a transition, so a table cannot declare one."""
    with pytest.raises(ValueError, match="self-loop RED"):
        TransitionTable(
            "Light",
            _Light,
            initial=_Light.RED,
            terminal=(_Light.OFF,),
            edges=[((_Light.RED, _Light.GREEN), _Light.RED, "blink", "test")],
        )


def test_table_rejects_an_exit_from_a_terminal_status() -> None:
    """A table cannot let a terminal status move on."""
    with pytest.raises(ValueError, match="terminal OFF cannot have exits"):
        TransitionTable(
            "Light",
            _Light,
            initial=_Light.RED,
            terminal=(_Light.OFF,),
            edges=[(_Light.OFF, _Light.RED, "switch on", "test")],
        )


def test_a_transition_asks_only_of_kernels_it_moves() -> None:
    """`ask` is what the moved kernels are asked for: without a kernel status it is refused."""
    asking = TransitionStatus(SessionStatus.PREPARING, KernelStatus.PREPARING, KernelIntent.PREPARE)
    assert asking.ask is KernelIntent.PREPARE
    with pytest.raises(ValueError, match="ask needs a kernel status"):
        TransitionStatus(SessionStatus.PREPARING, ask=KernelIntent.PREPARE)


def test_every_forward_kernel_move_goes_to_a_later_stage() -> None:
    """KERNEL_STAGE orders the kernel table: each edge but a re-scheduling (into PENDING)
    goes to a higher stage, so a report below a live kernel's stage is one it passed."""
    k = status.KernelStatus
    for edge in status.KERNEL_TRANSITIONS:
        if edge.target is not k.PENDING:
            assert status.KERNEL_STAGE[edge.target] > status.KERNEL_STAGE[edge.source], edge
    assert status.kernel_passed(k.PREPARED, k.CREATING)
    assert not status.kernel_passed(k.RUNNING, k.TERMINATED)  # an ended kernel: not known
