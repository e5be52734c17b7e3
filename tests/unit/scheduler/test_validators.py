"""Validators: access, dependencies, agents, slots, could-ever-fit, array throttle and owner
limits."""

from __future__ import annotations

import uuid

import pytest

from corral.domain.outcome import DependencyKind, SessionResult
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.session import PendingSession
from corral.domain.slots import ResourceSlots
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.scheduler import validators as v
from corral.scheduler.requests import session_request
from corral.scheduler.types import (
    AgentPool,
    DependencyState,
    GroupSnapshot,
    OwnerAccess,
    OwnerUsage,
    Verdict,
    VerdictKind,
)
from corral.scheduler.validators import VALIDATORS, ValidationContext, validate
from tests.unit.scheduler._builders import (
    CPU,
    GIB,
    dependency,
    pool,
    session,
    session_id,
    snapshot,
    usage,
    user,
)

FAIL, WAIT = VerdictKind.FAIL, VerdictKind.WAIT
AFTEROK, AFTERANY, AFTERNOTOK = (
    DependencyKind.AFTEROK,
    DependencyKind.AFTERANY,
    DependencyKind.AFTERNOTOK,
)
S = SessionStatus
SID = session_id(0xABCDEF12 << 96)  # a dependency whose short id reads "abcdef12"


def _agents() -> AgentPool:
    return pool(
        {"a1": {"cpu": 32 * CPU, "mem": 64 * GIB}, "a2": {"cpu": 16 * CPU, "mem": 32 * GIB}}
    )


def _check(
    s: PendingSession, snap: GroupSnapshot, ctx: ValidationContext | None = None
) -> Verdict | None:
    ctx = ctx or ValidationContext.build(snap)
    return validate(s, session_request(s, snap.agents.slot_index), ctx)


def _kind_code(verdict: Verdict | None) -> tuple[VerdictKind, str] | None:
    return None if verdict is None else (verdict.kind, verdict.code)


def test_validators_run_in_the_documented_order() -> None:
    """Access, dependencies, agents joined, known slots, could-ever-fit, array throttle, owner
    limits."""
    assert [validator.__name__ for validator in VALIDATORS] == [
        "check_access",
        "check_dependencies",
        "check_agents_joined",
        "check_known_slots",
        "check_could_ever_fit",
        "check_array_throttle",
        "check_owner_limits",
    ]


# --- dependencies ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deps", "expected"),
    [
        pytest.param([], None, id="none"),
        pytest.param([dependency(SID, S.TERMINATED, SessionResult.SUCCESS)], None, id="succeeded"),
        pytest.param([dependency(SID, None)], (FAIL, v.DEPENDENCY_MISSING), id="missing"),
        pytest.param([dependency(SID, S.ERROR)], (FAIL, v.DEPENDENCY_FAILED), id="error"),
        pytest.param([dependency(SID, S.CANCELLED)], (FAIL, v.DEPENDENCY_FAILED), id="cancelled"),
        pytest.param(
            [dependency(SID, S.TERMINATED, SessionResult.FAILURE)],
            (FAIL, v.DEPENDENCY_FAILED),
            id="terminated-unsuccessfully",
        ),
        pytest.param(
            [dependency(SID, S.TERMINATED, None)],
            (FAIL, v.DEPENDENCY_FAILED),
            id="terminated-without-result",
        ),
        pytest.param([dependency(SID, S.PENDING)], (WAIT, v.DEPENDENCY_PENDING), id="pending"),
        pytest.param([dependency(SID, S.RUNNING)], (WAIT, v.DEPENDENCY_PENDING), id="running"),
        pytest.param(
            [dependency(SID, S.TERMINATING)], (WAIT, v.DEPENDENCY_PENDING), id="terminating"
        ),
        pytest.param(
            [dependency(1, S.TERMINATED, SessionResult.SUCCESS), dependency(2, S.RUNNING)],
            (WAIT, v.DEPENDENCY_PENDING),
            id="one-done-one-running",
        ),
        pytest.param(
            [dependency(1, S.RUNNING), dependency(2, S.ERROR)],
            (FAIL, v.DEPENDENCY_FAILED),
            id="a-failed-one-beats-a-running-one",
        ),
    ],
)
def test_dependencies(deps: list[DependencyState], expected: tuple[str, str] | None) -> None:
    """Run only after every dependency succeeded; fail on a missing or failed one, else wait."""
    s = session()
    snap = snapshot(agents=_agents(), dependencies={s.id: deps})
    assert _kind_code(_check(s, snap)) == expected


@pytest.mark.parametrize(
    ("dep", "message"),
    [
        (dependency(SID, S.ERROR), "depends on session abcdef12 (afterok) which ended ERROR"),
        (
            dependency(SID, S.TERMINATED, SessionResult.FAILURE),
            "depends on session abcdef12 (afterok) which ended TERMINATED with result failure",
        ),
        (
            dependency(SID, S.TERMINATED, SessionResult.SUCCESS, kind=AFTERNOTOK),
            "depends on session abcdef12 (afternotok) which ended TERMINATED with result success",
        ),
        (dependency(SID, None), "depends on session abcdef12, which does not exist"),
        (
            dependency(SID, S.RUNNING),
            "waiting for session abcdef12 (afterok) to end; it is RUNNING",
        ),
        (
            dependency(SID, S.PENDING, kind=AFTERANY),
            "waiting for session abcdef12 (afterany) to end; it is PENDING",
        ),
    ],
)
def test_dependency_messages_name_the_dependency_and_its_status(
    dep: DependencyState, message: str
) -> None:
    """Messages give the dependency's short id and where it stands."""
    s = session()
    verdict = _check(s, snapshot(agents=_agents(), dependencies={s.id: [dep]}))
    assert verdict is not None
    assert verdict.message.startswith(message)


ENDINGS = [
    (S.TERMINATED, SessionResult.SUCCESS),
    (S.TERMINATED, SessionResult.FAILURE),
    (S.TERMINATED, SessionResult.CANCELLED),
    (S.TERMINATED, SessionResult.TIMEOUT),
    (S.ERROR, SessionResult.FAILURE),
    (S.CANCELLED, SessionResult.CANCELLED),
]


@pytest.mark.parametrize(("status", "result"), ENDINGS)
@pytest.mark.parametrize("kind", list(DependencyKind))
def test_each_dependency_kind_against_each_ending(
    kind: DependencyKind, status: SessionStatus, result: SessionResult
) -> None:
    """afterok runs after a success only, afternotok after anything else, afterany after all."""
    s = session()
    deps = {s.id: [dependency(SID, status, result, kind=kind)]}
    verdict = _check(s, snapshot(agents=_agents(), dependencies=deps))
    success = status is S.TERMINATED and result is SessionResult.SUCCESS
    runs = {AFTEROK: success, AFTERNOTOK: not success, AFTERANY: True}[kind]
    assert _kind_code(verdict) == (None if runs else (FAIL, v.DEPENDENCY_FAILED))


@pytest.mark.parametrize("kind", list(DependencyKind))
def test_every_kind_waits_for_a_dependency_that_has_not_ended(kind: DependencyKind) -> None:
    """No kind lets a session start before its dependency ended."""
    s = session()
    deps = {s.id: [dependency(SID, S.RUNNING, kind=kind)]}
    verdict = _check(s, snapshot(agents=_agents(), dependencies=deps))
    assert _kind_code(verdict) == (WAIT, v.DEPENDENCY_PENDING)


def test_dependencies_of_other_sessions_do_not_apply() -> None:
    """Only the session's own entry in the snapshot's dependencies counts."""
    other: SessionId = session_id(uuid.uuid4().int)
    snap = snapshot(agents=_agents(), dependencies={other: [dependency(SID, S.ERROR)]})
    assert _check(session(), snap) is None


# --- agents joined and known slots -----------------------------------------------------------


def test_no_registered_agent_makes_the_session_wait() -> None:
    """An empty group cannot judge any request: the session waits, whatever it asks for."""
    verdict = _check(session(slots={"cpu": 999 * CPU}), snapshot())
    assert _kind_code(verdict) == (WAIT, v.NO_AGENTS)
    assert verdict is not None
    assert "no agent has joined resource group 'default' yet" in verdict.message


def test_registered_but_unusable_agents_count_as_joined() -> None:
    """Agents that are down or unschedulable still define the group: no no_agents wait."""
    agents = pool({"a1": {"cpu": 4 * CPU}}, usable=[])
    assert _check(session(), snapshot(agents=agents)) is None


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        pytest.param({"cpu": CPU, "mem": GIB}, None, id="known"),
        pytest.param({"cpu": CPU, "cuda.device": 0}, None, id="zero-amount-of-unknown-is-fine"),
        pytest.param(
            {"cpu": CPU, "cuda.device": CPU},
            "requests cuda.device, which no agent in resource group 'default' has "
            "(it has: cpu, mem)",
            id="unknown",
        ),
        pytest.param(
            {"tpu": CPU, "cuda.device": CPU},
            "requests cuda.device, tpu, which no agent",
            id="several-unknown",
        ),
    ],
)
def test_unknown_slot_fails(slots: dict[str, int], expected: str | None) -> None:
    """A slot no agent of the group offers fails at once, naming it and the group's slots."""
    verdict = _check(session(slots=slots), snapshot(agents=_agents()))
    if expected is None:
        assert verdict is None
    else:
        assert _kind_code(verdict) == (FAIL, v.UNKNOWN_SLOT)
        assert verdict is not None
        assert verdict.message.startswith(expected)


# --- could ever fit --------------------------------------------------------------------------

_MULTI = "multi-node"


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        pytest.param(session(slots={"cpu": 32 * CPU, "mem": 64 * GIB}), True, id="exactly-a1"),
        pytest.param(session(slots={"cpu": 33 * CPU}), False, id="one-cpu-too-many"),
        pytest.param(
            session(slots={"cpu": 20 * CPU}, kernels=2), False, id="single-node-kernels-add-up"
        ),
        pytest.param(session(slots={"cpu": 16 * CPU}, kernels=2), True, id="single-node-two"),
        pytest.param(
            session(slots={"cpu": 16 * CPU}, kernels=3, mode=_MULTI),
            True,
            id="multi-fits-only-by-sharing-agents",
        ),
        pytest.param(
            session(slots={"cpu": 16 * CPU}, kernels=4, mode=_MULTI),
            False,
            id="multi-too-many-even-sharing",
        ),
        pytest.param(
            session(slots={"cpu": 20 * CPU}, kernels=2, mode=_MULTI),
            False,
            id="multi-kernel-fits-one-agent-only",
        ),
        pytest.param(
            session(slots={"cpu": 16 * CPU, "mem": 40 * GIB}, kernels=2, mode=_MULTI),
            False,
            id="multi-bound-by-mem",
        ),
        pytest.param(
            session(per_kernel=[{"cpu": 30 * CPU}, {"cpu": 2 * CPU}], mode=_MULTI),
            False,
            # a1 could take 30 and a2 the 2, but the bound is the largest kernel for every one.
            id="multi-mixed-kernels-judged-by-the-largest",
        ),
        pytest.param(session(slots={}, kernels=50, mode=_MULTI), True, id="multi-asks-nothing"),
    ],
)
def test_could_ever_fit(s: PendingSession, expected: bool) -> None:
    """A request must fit empty agents: one agent for single-node, sharing for multi-node."""
    verdict = _check(s, snapshot(agents=_agents()))
    assert _kind_code(verdict) == (None if expected else (FAIL, v.REQUEST_TOO_LARGE))


def test_could_ever_fit_judges_capacity_not_free_room_nor_usability() -> None:
    """A full, unusable agent still counts: the session may run there some day."""
    agents = pool(
        {"big": {"cpu": 64 * CPU}, "small": {"cpu": 4 * CPU}},
        occupied={"big": {"cpu": 64 * CPU}},
        usable=["small"],
    )
    assert _check(session(slots={"cpu": 64 * CPU}), snapshot(agents=agents)) is None


def test_too_large_single_node_message_names_request_and_largest_agent() -> None:
    """The message shows what one agent would need and what the largest agent has."""
    verdict = _check(session(slots={"cpu": 64 * CPU, "mem": 8 * GIB}), snapshot(agents=_agents()))
    assert verdict is not None
    assert verdict.message.startswith(
        "needs cpu=64 mem=8GiB on one agent, but the largest agent in resource group "
        "'default' has cpu=32 mem=64GiB"
    )


def test_too_large_message_shows_missing_slots_as_zero() -> None:
    """The agent shown is the one covering most of the request, with absent slots as 0."""
    agents = pool({"cpu-box": {"cpu": 64 * CPU}, "gpu-box": {"cpu": 4 * CPU, "gpu": 2 * CPU}})
    verdict = _check(session(slots={"cpu": 8 * CPU, "gpu": CPU}), snapshot(agents=agents))
    assert verdict is not None
    assert "largest agent in resource group 'default' has cpu=4 gpu=2" in verdict.message


def test_too_large_multi_node_message_counts_kernels() -> None:
    """The multi-node message says how many kernels the group could ever hold."""
    s = session(slots={"cpu": 16 * CPU}, kernels=4, mode=_MULTI)
    verdict = _check(s, snapshot(agents=_agents()))
    assert verdict is not None
    assert verdict.message.startswith(
        "needs 4 kernels of cpu=16, but the 2 agent(s) in resource group 'default' could hold "
        "at most 3 of them even sharing agents"
    )


def test_could_ever_fit_keeps_single_and_multi_node_apart() -> None:
    """The same kernels judged once per mode: remembering one verdict never answers the other."""
    snap = snapshot(agents=_agents())
    ctx = ValidationContext.build(snap)
    single = session(slots={"cpu": 16 * CPU}, kernels=3)
    multi = session(slots={"cpu": 16 * CPU}, kernels=3, mode=_MULTI)
    assert _kind_code(_check(single, snap, ctx)) == (FAIL, v.REQUEST_TOO_LARGE)
    assert _check(multi, snap, ctx) is None
    assert _kind_code(_check(single, snap, ctx)) == (FAIL, v.REQUEST_TOO_LARGE)


# --- owner limits ----------------------------------------------------------------------------

LIMITS = ResourceGroupOptions(
    max_sessions_per_owner=2, max_slots_per_owner=ResourceSlots({"cpu": 32})
)
BIG = pool({"a1": {"cpu": 128 * CPU, "mem": 512 * GIB}})


@pytest.mark.parametrize(
    ("cpu", "held", "expected"),
    [
        pytest.param(8, {}, None, id="nothing-held"),
        pytest.param(32, {}, None, id="exactly-the-slot-limit"),
        pytest.param(40, {}, (FAIL, v.QUOTA_EXCEEDED), id="alone-over-the-slot-limit"),
        pytest.param(40, {1: usage(2)}, (FAIL, v.QUOTA_EXCEEDED), id="quota-before-count"),
        pytest.param(1, {1: usage(2)}, (WAIT, v.OWNER_SESSION_LIMIT), id="at-session-limit"),
        pytest.param(8, {1: usage(1, {"cpu": 24 * CPU})}, None, id="reaches-slot-limit"),
        pytest.param(
            16, {1: usage(1, {"cpu": 24 * CPU})}, (WAIT, v.OWNER_SLOT_LIMIT), id="over-slot-limit"
        ),
        pytest.param(16, {2: usage(2, {"cpu": 32 * CPU})}, None, id="others-usage-ignored"),
    ],
)
def test_owner_limits(cpu: int, held: dict[int, OwnerUsage], expected: tuple[str, str]) -> None:
    """Over the slot limit alone fails; over the owner's session or slot limit now waits."""
    snap = snapshot(agents=BIG, options=LIMITS, usage=held)
    assert _kind_code(_check(session(owner=1, slots={"cpu": cpu * CPU}), snap)) == expected


def test_owner_limits_do_not_apply_to_unlimited_slots_or_groups() -> None:
    """Slots the limit does not name, and groups without limits, are unlimited."""
    huge_mem = session(slots={"cpu": CPU, "mem": 500 * GIB})
    assert _check(huge_mem, snapshot(agents=BIG, options=LIMITS)) is None
    many = {1: usage(50, {"cpu": 100 * CPU})}
    assert _check(session(owner=1), snapshot(agents=BIG, usage=many)) is None


@pytest.mark.parametrize(
    ("cpu", "held", "message"),
    [
        (40, {}, "needs cpu=40 but the per-owner limit in resource group 'default' is cpu=32"),
        (
            1,
            {1: usage(2)},
            "its owner already has 2 session(s) holding resources in resource group 'default', "
            "the per-owner limit of 2",
        ),
        (
            16,
            {1: usage(1, {"cpu": 24 * CPU})},
            "its owner holds cpu=24 in resource group 'default'; adding cpu=16 would pass the "
            "per-owner limit of cpu=32",
        ),
    ],
)
def test_owner_limit_messages_name_the_amounts(
    cpu: int, held: dict[int, OwnerUsage], message: str
) -> None:
    """Messages give the request, what the owner holds and the limit."""
    snap = snapshot(agents=BIG, options=LIMITS, usage=held)
    verdict = _check(session(owner=1, slots={"cpu": cpu * CPU}), snap)
    assert verdict is not None
    assert verdict.message.startswith(message)


def test_sessions_placed_in_this_pass_count_against_owner_limits() -> None:
    """Live usage: after the planner adds placed sessions, the owner's next ones wait."""
    snap = snapshot(agents=BIG, options=LIMITS, usage={1: usage(1, {"cpu": 8 * CPU})})
    ctx = ValidationContext.build(snap)
    first, second = session(owner=1, slots={"cpu": 16 * CPU}), session(owner=1)
    assert _check(first, snap, ctx) is None

    ctx.add_placed(first, session_request(first, snap.agents.slot_index))

    assert ctx.usage[user(1)] == usage(2, {"cpu": 24 * CPU})
    assert _kind_code(_check(second, snap, ctx)) == (WAIT, v.OWNER_SESSION_LIMIT)
    assert snap.usage[user(1)] == usage(1, {"cpu": 8 * CPU}), "the snapshot stays as read"


def test_live_usage_can_be_edited_directly() -> None:
    """The validators read ctx.usage as it stands, including owners added after build."""
    snap = snapshot(agents=BIG, options=LIMITS)
    ctx = ValidationContext.build(snap)
    ctx.usage[user(1)] = usage(1, {"cpu": 30 * CPU})
    assert _kind_code(_check(session(owner=1, slots={"cpu": 4 * CPU}), snap, ctx)) == (
        WAIT,
        v.OWNER_SLOT_LIMIT,
    )


# --- access: the group's users and max_user_priority, as they are now ------------------------

ALICE, BOB, ROOT = OwnerAccess("alice", False), OwnerAccess("bob", False), OwnerAccess("root", True)
LISTED = ResourceGroupOptions(allowed_users=("alice",))


@pytest.mark.parametrize(
    ("options", "owner", "priority", "expected"),
    [
        pytest.param(ResourceGroupOptions(), BOB, 0, None, id="open-group"),
        pytest.param(LISTED, ALICE, 0, None, id="listed-user"),
        pytest.param(LISTED, BOB, 0, v.ACCESS_DENIED, id="user-not-listed"),
        pytest.param(LISTED, ROOT, 0, None, id="admins-always-may"),
        pytest.param(ResourceGroupOptions(allowed_users=()), ALICE, 0, v.ACCESS_DENIED, id="none"),
        pytest.param(ResourceGroupOptions(), BOB, -5, None, id="lower-priority"),
        pytest.param(ResourceGroupOptions(), BOB, 1, v.PRIORITY_NOT_ALLOWED, id="above-max"),
        pytest.param(ResourceGroupOptions(), ROOT, 100, None, id="admin-above-max"),
        pytest.param(
            ResourceGroupOptions(max_user_priority=10), BOB, 10, None, id="at-a-raised-max"
        ),
        pytest.param(LISTED, BOB, 50, v.ACCESS_DENIED, id="access-before-priority"),
    ],
)
def test_access(
    options: ResourceGroupOptions, owner: OwnerAccess, priority: int, expected: str | None
) -> None:
    """A session its group's rules no longer admit waits (it is not failed), naming the rule."""
    s = session(owner=7, priority=priority)
    verdict = _check(s, snapshot(agents=_agents(), options=options, owners={7: owner}))
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None and (verdict.kind, verdict.code) == (WAIT, expected)


def test_access_messages_say_why_and_what_happens_next() -> None:
    """The reasons name the group, the owner or the priority, and that the session waits."""
    denied = _check(
        session(owner=7),
        snapshot(agents=_agents(), options=LISTED, owners={7: BOB}, group="gpu"),
    )
    assert denied is not None
    assert "resource group 'gpu' is open to listed users only, and 'bob'" in denied.message
    assert "waits until an admin opens the group" in denied.message
    high = _check(
        session(owner=7, priority=30),
        snapshot(agents=_agents(), options=ResourceGroupOptions(), owners={7: BOB}),
    )
    assert high is not None
    assert "priority 30 is above 0, the max_user_priority" in high.message
    assert "submit it again at priority 0 or less" in high.message


def test_an_owner_the_snapshot_lacks_is_judged_a_plain_user() -> None:
    """Where the rules apply and the owner is unknown, the session is not let through."""
    verdict = _check(
        session(owner=9, priority=5), snapshot(agents=_agents(), options=ResourceGroupOptions())
    )
    assert verdict is not None and verdict.code == v.PRIORITY_NOT_ALLOWED


# --- order between validators ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "deps", "agents", "expected"),
    [
        pytest.param(
            {"cpu": 999 * CPU},
            [dependency(SID, None)],
            True,
            v.DEPENDENCY_MISSING,
            id="missing-dependency-beats-too-large",
        ),
        pytest.param(
            {"cpu": 999 * CPU},
            [dependency(SID, S.RUNNING)],
            True,
            v.DEPENDENCY_PENDING,
            id="pending-dependency-beats-too-large",
        ),
        pytest.param({"cpu": CPU, "gpu": CPU}, [], False, v.NO_AGENTS, id="no-agents-first"),
        pytest.param(
            {"cpu": 999 * CPU, "gpu": CPU},
            [],
            True,
            v.UNKNOWN_SLOT,
            id="unknown-slot-beats-too-large",
        ),
        pytest.param(
            {"cpu": 64 * CPU},
            [],
            True,
            v.REQUEST_TOO_LARGE,
            id="too-large-beats-quota",
        ),
    ],
)
def test_first_verdict_wins(
    slots: dict[str, int],
    deps: list[DependencyState],
    agents: bool,
    expected: str,
) -> None:
    """Validators run in order and the first verdict is the one reported."""
    s = session(slots=slots)
    snap = snapshot(
        agents=_agents() if agents else None,
        dependencies={s.id: deps},
        options=LIMITS,
    )
    verdict = _check(s, snap)
    assert verdict is not None
    assert verdict.code == expected


def test_codes_are_stable_strings() -> None:
    """The codes are part of the API (users and dashboards match on them)."""
    assert {
        v.DEPENDENCY_MISSING,
        v.DEPENDENCY_FAILED,
        v.DEPENDENCY_PENDING,
        v.NO_AGENTS,
        v.UNKNOWN_SLOT,
        v.REQUEST_TOO_LARGE,
        v.QUOTA_EXCEEDED,
        v.OWNER_SESSION_LIMIT,
        v.OWNER_SLOT_LIMIT,
        v.ACCESS_DENIED,
        v.PRIORITY_NOT_ALLOWED,
    } == {
        "dependency_missing",
        "dependency_failed",
        "dependency_pending",
        "no_agents",
        "unknown_slot",
        "request_too_large",
        "quota_exceeded",
        "owner_session_limit",
        "owner_slot_limit",
        "access_denied",
        "priority_not_allowed",
    }
