"""The kernel progress machine against spec document 3, and its invariants as properties."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.agent import progress
from corral.agent.progress import (
    BLACK_BOX_TRANSITIONS,
    BLACK_BOX_UNUSED,
    DEFAULT_ERROR_LIMITS,
    KERNEL_STATUS,
    NORMAL_TRANSITIONS,
    TERMINAL,
    ErrorLimitExceededError,
    ErrorOriginError,
    IllegalTransitionError,
    KernelProgress,
    Progress,
    ProgressError,
    RepeatedErrorError,
    TerminalStateError,
    check_tables,
    merge_error_limits,
)
from corral.domain.status import KernelStatus

P, K = Progress, KernelStatus
T0 = datetime(2030, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock that moves by `step` on every read, and on demand."""

    def __init__(self, step: timedelta = timedelta(0)) -> None:
        self.now, self.step = T0, step

    def __call__(self) -> datetime:
        now, self.now = self.now, self.now + self.step
        return now

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def walk(flow: str, *, black_box: bool = False) -> KernelProgress:
    """A machine driven through `flow`, written as the document writes its examples."""
    states = [Progress(name) for name in flow.split("->")]
    assert states[0] == P.NOT_STARTED
    machine = KernelProgress(black_box=black_box, clock=FakeClock())
    for state in states[1:]:
        machine.advance(state)
    return machine


def snapshot(machine: KernelProgress) -> tuple[object, ...]:
    """Everything a refused move must leave untouched."""
    return machine.state, machine.origin, dict(machine.errors), machine.history


# Spec document 3, "Worker States Flow", written by hand: each edge with its decision nodes
# collapsed (NOT_STARTED → D1 → D2 → GENERATING becomes NOT_STARTED → GENERATING).
TYPICAL_DIAGRAM_EDGES = {
    (P.NOT_STARTED, P.PRELOADING),
    (P.NOT_STARTED, P.GENERATING),
    (P.NOT_STARTED, P.PENDING_POST_PROCESSING),
    (P.NOT_STARTED, P.PENDING_SAFETY_CHECK),
    (P.PRELOADING, P.PRELOADING_COMPLETE),
    (P.PRELOADING_COMPLETE, P.GENERATING),
    (P.PRELOADING_COMPLETE, P.PENDING_POST_PROCESSING),
    (P.PRELOADING_COMPLETE, P.PENDING_SAFETY_CHECK),
    (P.GENERATING, P.PENDING_POST_PROCESSING),
    (P.GENERATING, P.PENDING_SAFETY_CHECK),
    (P.PENDING_POST_PROCESSING, P.POST_PROCESSING),
    (P.POST_PROCESSING, P.PENDING_SAFETY_CHECK),
    (P.POST_PROCESSING, P.PENDING_SUBMIT),
    (P.POST_PROCESSING, P.COMPLETE),
    (P.PENDING_SAFETY_CHECK, P.SAFETY_CHECKING),
    (P.SAFETY_CHECKING, P.PENDING_SUBMIT),
    (P.SAFETY_CHECKING, P.COMPLETE),
    (P.PENDING_SUBMIT, P.SUBMITTING),
    (P.SUBMITTING, P.SUBMIT_COMPLETE),
    (P.SUBMIT_COMPLETE, P.COMPLETE),
}
MILESTONES = {P.GENERATION_COMPLETE, P.POST_PROCESSING_COMPLETE, P.SAFETY_CHECK_COMPLETE}

# Spec document 3, "Black Box States", written by hand.
BLACK_BOX_DIAGRAM_EDGES = {
    (P.NOT_STARTED, P.GENERATING),
    (P.GENERATING, P.PENDING_SUBMIT),
    (P.GENERATING, P.PENDING_SAFETY_CHECK),
    (P.GENERATING, P.COMPLETE),
    (P.PENDING_SAFETY_CHECK, P.SAFETY_CHECKING),
    (P.SAFETY_CHECKING, P.PENDING_SUBMIT),
    (P.SAFETY_CHECKING, P.COMPLETE),
    (P.PENDING_SUBMIT, P.SUBMITTING),
    (P.SUBMITTING, P.SUBMIT_COMPLETE),
    (P.SUBMITTING, P.COMPLETE),
    (P.SUBMIT_COMPLETE, P.COMPLETE),
}

# DESIGN.md, "Lifecycles": kernel execution on an agent.
DESIGN_KERNEL_STATUS = {
    P.PRELOADING: K.PULLING,
    P.PRELOADING_COMPLETE: K.PREPARED,
    P.GENERATING: K.RUNNING,
    P.COMPLETE: K.TERMINATED,
    P.REPORTED_FAILED: K.ERROR,
    P.USER_ABORT_COMPLETE: K.TERMINATED,
}
POST_RUN = [
    P.GENERATION_COMPLETE,
    P.PENDING_POST_PROCESSING,
    P.POST_PROCESSING,
    P.POST_PROCESSING_COMPLETE,
    P.PENDING_SAFETY_CHECK,
    P.SAFETY_CHECKING,
    P.SAFETY_CHECK_COMPLETE,
    P.PENDING_SUBMIT,
    P.SUBMITTING,
    P.SUBMIT_COMPLETE,
]


def edges(table: Mapping[Progress, frozenset[Progress]]) -> set[tuple[Progress, Progress]]:
    """The (source, target) pairs of a forward map."""
    return {(source, target) for source, targets in table.items() for target in targets}


# --- the document's examples ---------------------------------------------------------------


def test_good_example_recovers_from_a_preloading_error() -> None:
    """NOT_STARTED→PRELOADING→ERROR→PRELOADING→PRELOADING_COMPLETE is accepted."""
    machine = walk("NOT_STARTED->PRELOADING->ERROR->PRELOADING->PRELOADING_COMPLETE")
    assert machine.state == P.PRELOADING_COMPLETE
    assert machine.errors == {P.PRELOADING: 1}
    assert machine.origin is None


def test_good_example_fails_again_then_aborts_and_reports() -> None:
    """…→ERROR→PRELOADING→ERROR→ABORTED→REPORTED_FAILED is accepted and ends the kernel."""
    machine = walk("NOT_STARTED->PRELOADING->ERROR->PRELOADING->ERROR->ABORTED->REPORTED_FAILED")
    assert machine.terminal
    assert machine.kernel_status() == K.ERROR
    assert machine.errors == {P.PRELOADING: 2}


def test_good_example_user_abort() -> None:
    """NOT_STARTED→PRELOADING→USER_REQUESTED_ABORT→USER_ABORT_COMPLETE is accepted."""
    machine = walk("NOT_STARTED->PRELOADING->USER_REQUESTED_ABORT->USER_ABORT_COMPLETE")
    assert machine.terminal
    assert machine.kernel_status() == K.TERMINATED


def test_bad_example_error_must_return_to_its_origin() -> None:
    """NOT_STARTED→PRELOADING→ERROR→GENERATING is refused with ErrorOriginError."""
    machine = walk("NOT_STARTED->PRELOADING->ERROR")
    before = snapshot(machine)
    with pytest.raises(ErrorOriginError, match=r"ERROR → GENERATING.*PRELOADING") as refused:
        machine.advance(P.GENERATING)
    assert (refused.value.origin, refused.value.target) == (P.PRELOADING, P.GENERATING)
    assert snapshot(machine) == before
    assert machine.allowed_next() == {P.PRELOADING, P.ABORTED, P.ABANDONED}


def test_bad_example_error_from_error_is_refused() -> None:
    """NOT_STARTED→PRELOADING→ERROR→ERROR is refused, by advance and by fail alike."""
    machine = walk("NOT_STARTED->PRELOADING->ERROR")
    before = snapshot(machine)
    with pytest.raises(RepeatedErrorError, match="ERROR → ERROR"):
        machine.advance(P.ERROR)
    with pytest.raises(RepeatedErrorError):
        machine.fail("again")
    assert snapshot(machine) == before


# --- the forward maps ------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target"), sorted(TYPICAL_DIAGRAM_EDGES))
def test_every_typical_diagram_edge_is_a_path_through_at_most_one_milestone(
    source: Progress, target: Progress
) -> None:
    """Each edge of the typical flowchart is a normal move, or two moves via a milestone."""
    direct = target in NORMAL_TRANSITIONS[source]
    via = [
        m for m in MILESTONES if m in NORMAL_TRANSITIONS[source] and target in NORMAL_TRANSITIONS[m]
    ]
    assert direct or via


def test_normal_map_adds_only_milestone_edges_to_the_diagram() -> None:
    """Every normal edge not touching a milestone is an edge of the typical flowchart."""
    extra = {
        (a, b) for a, b in edges(NORMAL_TRANSITIONS) if a not in MILESTONES and b not in MILESTONES
    }
    assert extra <= TYPICAL_DIAGRAM_EDGES


def test_black_box_map_is_exactly_the_black_box_diagram() -> None:
    """The black-box forward map has the document's black-box edges, no more, no fewer."""
    assert edges(BLACK_BOX_TRANSITIONS) == BLACK_BOX_DIAGRAM_EDGES


def test_normal_mode_happy_path_reports_the_design_statuses() -> None:
    """Every normal stage in order reaches COMPLETE, reporting PULLING…TERMINATED on the way."""
    machine = KernelProgress(clock=FakeClock())
    statuses = []
    for state in [P.PRELOADING, P.PRELOADING_COMPLETE, P.GENERATING, *POST_RUN, P.COMPLETE]:
        machine.advance(state)
        statuses.append(machine.kernel_status())
    assert machine.terminal and machine.state == P.COMPLETE
    assert statuses == [K.PULLING, K.PREPARED, K.RUNNING] + [K.TERMINATING] * 10 + [K.TERMINATED]
    assert machine.allowed_next() == frozenset()


def test_black_box_mode_happy_path() -> None:
    """Black-box mode goes NOT_STARTED→GENERATING→…→SUBMIT_COMPLETE→COMPLETE."""
    machine = walk(
        "NOT_STARTED->GENERATING->PENDING_SAFETY_CHECK->SAFETY_CHECKING->PENDING_SUBMIT"
        "->SUBMITTING->SUBMIT_COMPLETE->COMPLETE",
        black_box=True,
    )
    assert machine.state == P.COMPLETE


@pytest.mark.parametrize("stage", sorted(BLACK_BOX_UNUSED))
def test_black_box_mode_refuses_the_stages_it_does_not_use(stage: Progress) -> None:
    """PRELOADING and the other unused stages are refused in black-box mode, saying why."""
    machine = KernelProgress(black_box=True, clock=FakeClock())
    with pytest.raises(IllegalTransitionError, match="not used in black-box mode"):
        machine.advance(stage)
    assert stage not in {s for pair in BLACK_BOX_DIAGRAM_EDGES for s in pair}


def test_normal_mode_refuses_skipping_a_stage() -> None:
    """A move outside the forward map is refused, naming both states and what is allowed."""
    machine = walk("NOT_STARTED->GENERATING")
    with pytest.raises(IllegalTransitionError, match=r"GENERATING → PENDING_SUBMIT.*allow only"):
        machine.advance(P.PENDING_SUBMIT)
    assert machine.state == P.GENERATING


# --- error and abort rules -------------------------------------------------------------------


def test_terminal_states_have_no_way_out() -> None:
    """From every terminal state every move is refused with TerminalStateError."""
    for flow in [
        "NOT_STARTED->GENERATING->GENERATION_COMPLETE->COMPLETE",
        "NOT_STARTED->ABORTED->REPORTED_FAILED",
        "NOT_STARTED->USER_REQUESTED_ABORT->USER_ABORT_COMPLETE",
        "NOT_STARTED->ERROR->ABANDONED",
    ]:
        machine = walk(flow)
        for target in P:
            with pytest.raises(TerminalStateError, match="is terminal"):
                machine.advance(target)
        assert machine.allowed_next() == frozenset()


def test_reporting_a_failure_may_itself_fail_and_retry() -> None:
    """ABORTED→ERROR returns to ABORTED; after ABORTED's 10 failures only ABANDONED is left."""
    machine = walk("NOT_STARTED->GENERATING->ABORTED")
    for _ in range(9):
        machine.fail("manager unreachable")
        assert machine.origin == P.ABORTED
        machine.retry()
    machine.fail("manager unreachable")
    assert not machine.can_retry()
    assert machine.allowed_next() == {P.ABANDONED}
    machine.abandon()
    assert machine.kernel_status() is None


def test_user_abort_exits() -> None:
    """USER_REQUESTED_ABORT may fail and retry, but not turn into ABORTED."""
    machine = walk("NOT_STARTED->GENERATING->USER_REQUESTED_ABORT")
    assert machine.allowed_next() == {P.USER_ABORT_COMPLETE, P.ABANDONED, P.ERROR}
    with pytest.raises(IllegalTransitionError):
        machine.abort("changed my mind")
    machine.fail("kill timed out")
    assert machine.origin == P.USER_REQUESTED_ABORT
    machine.retry()
    machine.advance(P.USER_ABORT_COMPLETE)
    assert machine.kernel_status() == K.TERMINATED


def test_user_abort_is_refused_from_an_error_in_a_work_state() -> None:
    """ERROR's exits are closed: a user abort must wait for the retry, or the kernel aborts."""
    machine = walk("NOT_STARTED->GENERATING->ERROR")
    with pytest.raises(ErrorOriginError, match="USER_REQUESTED_ABORT"):
        machine.user_abort()
    machine.retry()
    machine.user_abort()
    assert machine.state == P.USER_REQUESTED_ABORT


def test_abort_loop_is_bounded_by_the_user_abort_limit() -> None:
    """ABORTED→USER_REQUESTED_ABORT→ERROR→ABORTED repeats only until the user abort's limit."""
    machine = walk("NOT_STARTED->GENERATING->ABORTED")
    for _ in range(3):
        machine.user_abort()
        machine.fail("kill failed")
        machine.abort("giving up on the user abort")
    assert machine.errors == {P.USER_REQUESTED_ABORT: 3}
    with pytest.raises(ErrorLimitExceededError, match="USER_REQUESTED_ABORT has failed 3"):
        machine.user_abort()
    assert machine.allowed_next() == {P.REPORTED_FAILED, P.ABANDONED, P.ERROR}


def test_aborted_exits() -> None:
    """ABORTED may go to REPORTED_FAILED, ABANDONED, ERROR or USER_REQUESTED_ABORT only."""
    machine = walk("NOT_STARTED->ABORTED")
    expected = {P.REPORTED_FAILED, P.ABANDONED, P.ERROR, P.USER_REQUESTED_ABORT}
    assert machine.allowed_next() == expected


def test_abandon_is_refused_from_a_work_state() -> None:
    """A working kernel must fail or abort before it can be abandoned."""
    machine = walk("NOT_STARTED->GENERATING")
    with pytest.raises(IllegalTransitionError):
        machine.abandon()


def test_retry_outside_error_is_refused() -> None:
    """retry() without a pending ERROR raises a ProgressError and changes nothing."""
    machine = walk("NOT_STARTED->GENERATING")
    before = snapshot(machine)
    with pytest.raises(ProgressError, match="needs an ERROR"):
        machine.retry()
    assert snapshot(machine) == before
    assert not machine.can_retry()


def test_history_records_causes_and_times() -> None:
    """Each step keeps its time, cause and message; last_cause is the latest failure's."""
    clock = FakeClock(step=timedelta(seconds=1))
    machine = KernelProgress(clock=clock)
    machine.advance(P.GENERATING)
    machine.fail("oom", "CUDA out of memory")
    machine.abort("gave up")
    machine.advance(P.REPORTED_FAILED)
    assert [(s.state, s.cause, s.message) for s in machine.history] == [
        (P.NOT_STARTED, None, ""),
        (P.GENERATING, None, ""),
        (P.ERROR, "oom", "CUDA out of memory"),
        (P.ABORTED, "gave up", ""),
        (P.REPORTED_FAILED, None, ""),
    ]
    assert [s.entered_at for s in machine.history] == [T0 + timedelta(seconds=i) for i in range(5)]
    assert machine.last_cause == "gave up"


# --- error limits ----------------------------------------------------------------------------


def test_default_error_limits() -> None:
    """The documented limits, corral's for the abort states, and 1 everywhere else."""
    special = {
        P.PRELOADING: 3,
        P.GENERATING: 3,
        P.POST_PROCESSING: 3,
        P.SAFETY_CHECKING: 3,
        P.SUBMITTING: 10,
        P.ABORTED: 10,
        P.USER_REQUESTED_ABORT: 3,
    }
    assert dict(DEFAULT_ERROR_LIMITS) == {s: special.get(s, 1) for s in P}


def test_preloading_fails_three_times_then_only_abort_or_abandon() -> None:
    """A limit of 3 means three failed attempts: the third failure cannot be retried."""
    machine = walk("NOT_STARTED->PRELOADING")
    for _ in range(2):
        machine.fail("pull failed")
        machine.retry()
    machine.fail("pull failed")
    before = snapshot(machine)
    with pytest.raises(ErrorLimitExceededError, match="PRELOADING has failed 3") as refused:
        machine.retry()
    assert (refused.value.state, refused.value.limit) == (P.PRELOADING, 3)
    assert snapshot(machine) == before
    assert not machine.can_retry()
    assert machine.allowed_next() == {P.ABORTED, P.ABANDONED}
    machine.abort("pull failed three times")
    assert machine.state == P.ABORTED


def test_submitting_allows_ten_attempts() -> None:
    """SUBMITTING may fail nine times and still retry; the tenth failure is final."""
    machine = walk("NOT_STARTED->GENERATING->GENERATION_COMPLETE->PENDING_SUBMIT->SUBMITTING")
    for _ in range(9):
        machine.fail("upload failed")
        machine.retry()
    machine.fail("upload failed")
    assert machine.errors[P.SUBMITTING] == 10
    with pytest.raises(ErrorLimitExceededError):
        machine.advance(P.SUBMITTING)


def test_error_limit_override_is_merged_over_the_defaults() -> None:
    """Overrides replace their states' limits and keep every other default."""
    # A string key is what a TOML file gives; a StrEnum accepts it.
    overrides = {P.GENERATING: 1, "PRELOADING": 5}
    machine = KernelProgress(error_limits=overrides, clock=FakeClock())  # type: ignore[arg-type]
    assert machine.error_limits[P.GENERATING] == 1
    assert machine.error_limits[P.PRELOADING] == 5
    assert machine.error_limits[P.SUBMITTING] == 10
    machine.advance(P.GENERATING)
    machine.fail("crash")
    assert not machine.can_retry()


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({P.PRELOADING: 0}, "positive int"),
        ({P.PRELOADING: -2}, "positive int"),
        ({P.PRELOADING: True}, "positive int"),
        ({P.PRELOADING: 2.0}, "positive int"),
        ({"PREHEATING": 2}, "unknown progress state"),
    ],
)
def test_bad_error_limit_override_is_rejected(
    overrides: dict[object, object], complaint: str
) -> None:
    """Unknown states and non-positive or non-int limits are rejected with a clear message."""
    with pytest.raises(ValueError, match=complaint):
        merge_error_limits(overrides)  # type: ignore[arg-type]


# --- kernel status and durations -------------------------------------------------------------


def test_kernel_status_table_covers_every_state_and_matches_design() -> None:
    """All 21 states have an entry, and the entries are DESIGN.md's mapping."""
    assert set(KERNEL_STATUS) == set(P) and len(P) == 21
    assert {s: KERNEL_STATUS[s] for s in DESIGN_KERNEL_STATUS} == DESIGN_KERNEL_STATUS
    assert all(KERNEL_STATUS[s] == K.TERMINATING for s in [*POST_RUN, P.USER_REQUESTED_ABORT])
    silent = {s for s, status in KERNEL_STATUS.items() if status is None}
    assert silent == {P.NOT_STARTED, P.ERROR, P.ABORTED, P.ABANDONED}


def test_stage_durations_sum_repeats_and_count_the_current_state() -> None:
    """Time in each state is summed over its visits; the current state counts up to now."""
    clock = FakeClock()
    machine = KernelProgress(clock=clock)
    clock.tick(5)
    machine.advance(P.PRELOADING)
    clock.tick(10)
    machine.fail("pull")
    clock.tick(2)
    machine.retry()
    clock.tick(3)
    machine.advance(P.PRELOADING_COMPLETE)
    clock.tick(7)
    assert machine.stage_durations() == {
        P.NOT_STARTED: timedelta(seconds=5),
        P.PRELOADING: timedelta(seconds=13),
        P.ERROR: timedelta(seconds=2),
        P.PRELOADING_COMPLETE: timedelta(seconds=7),
    }


# --- table consistency -----------------------------------------------------------------------


def test_check_tables_passes() -> None:
    """The shipped tables are consistent: covered, reachable, terminating."""
    check_tables()


def test_check_tables_catches_broken_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing status entry and a stage no flow reaches are both reported."""
    status = {s: v for s, v in KERNEL_STATUS.items() if s != P.SUBMITTING}
    normal = {s: t for s, t in NORMAL_TRANSITIONS.items() if s != P.PRELOADING_COMPLETE}
    normal[P.PRELOADING] = frozenset()
    monkeypatch.setattr(progress, "KERNEL_STATUS", status)
    monkeypatch.setattr(progress, "NORMAL_TRANSITIONS", normal)
    with pytest.raises(ValueError, match="SUBMITTING has no KERNEL_STATUS") as broken:
        check_tables()
    assert "normal: reachable" in str(broken.value)


# --- properties ------------------------------------------------------------------------------


def rule_allows(
    source: Progress, target: Progress, origin: Progress | None, black_box: bool
) -> bool:
    """The rules, restated independently of the module: may `source` go to `target`?"""
    forward = BLACK_BOX_TRANSITIONS if black_box else NORMAL_TRANSITIONS
    if source in TERMINAL:
        return False
    if source == P.ERROR:
        return target in {origin, P.ABORTED, P.ABANDONED}
    if source == P.ABORTED:
        return target in {P.REPORTED_FAILED, P.ABANDONED, P.ERROR, P.USER_REQUESTED_ABORT}
    if source == P.USER_REQUESTED_ABORT:
        return target in {P.USER_ABORT_COMPLETE, P.ABANDONED, P.ERROR}
    return target in forward.get(source, frozenset()) or target in {
        P.ERROR,
        P.ABORTED,
        P.USER_REQUESTED_ABORT,
    }


def check_invariants(machine: KernelProgress) -> None:
    """What must hold after any accepted or refused event."""
    if machine.state == P.ERROR:
        assert machine.origin is not None and machine.origin != P.ERROR
    else:
        assert machine.origin is None
    for state, failures in machine.errors.items():
        assert 1 <= failures <= machine.error_limits[state]
    steps = [step.state for step in machine.history]
    assert steps[0] == P.NOT_STARTED and steps[-1] == machine.state
    assert not any(s in TERMINAL for s in steps[:-1])
    failed = Counter(a for a, b in itertools.pairwise(steps) if b == P.ERROR)
    assert failed == Counter(machine.errors)
    for i in range(1, len(steps)):
        origin = steps[i - 2] if steps[i - 1] == P.ERROR else None
        assert rule_allows(steps[i - 1], steps[i], origin, machine.black_box), steps[i - 1 : i + 1]
    assert machine.terminal == (machine.state in TERMINAL)


limits_strategy = st.dictionaries(st.sampled_from(list(P)), st.integers(1, 4), max_size=6)
events_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.sampled_from(list(P))),
        st.tuples(st.just("pick"), st.integers(0, 20)),
        st.tuples(st.sampled_from(["fail", "retry", "abort", "user_abort", "abandon"]), st.none()),
    ),
    max_size=60,
)


def apply(machine: KernelProgress, event: str, arg: object) -> None:
    """Perform one random event on the machine."""
    if event == "advance":
        assert isinstance(arg, Progress)
        machine.advance(arg)
    elif event == "pick":
        allowed = sorted(machine.allowed_next())
        assert isinstance(arg, int)
        machine.advance(allowed[arg % len(allowed)] if allowed else P.NOT_STARTED)
    elif event in ("fail", "abort"):
        getattr(machine, event)("chaos")
    else:
        getattr(machine, event)()


@settings(max_examples=300, deadline=None)
@given(black_box=st.booleans(), limits=limits_strategy, events=events_strategy)
def test_random_events_keep_the_invariants(
    black_box: bool, limits: dict[Progress, int], events: list[tuple[str, object]]
) -> None:
    """Any event sequence: refusals change nothing, moves obey the rules, limits hold."""
    machine = KernelProgress(
        black_box=black_box, error_limits=limits, clock=FakeClock(timedelta(1))
    )
    for event, arg in events:
        was_terminal, before = machine.terminal, snapshot(machine)
        allowed = machine.allowed_next()
        try:
            apply(machine, event, arg)
        except ProgressError:
            assert snapshot(machine) == before
        else:
            assert machine.state in allowed
        assert machine.terminal or not was_terminal
        check_invariants(machine)


def clone(machine: KernelProgress) -> KernelProgress:
    """An independent copy, rebuilt by replaying the machine's history."""
    twin = KernelProgress(
        black_box=machine.black_box, error_limits=machine.error_limits, clock=FakeClock()
    )
    for step in machine.history[1:]:
        twin.advance(step.state)
    return twin


def finish(machine: KernelProgress) -> int:
    """Drive to a terminal state greedily (a terminal move, else abort); return the steps."""
    steps = 0
    while not machine.terminal:
        allowed = machine.allowed_next()
        machine.advance(min(allowed & TERMINAL) if allowed & TERMINAL else P.ABORTED)
        steps += 1
    return steps


@settings(max_examples=300, deadline=None)
@given(black_box=st.booleans(), limits=limits_strategy, picks=st.lists(st.integers(0, 20)))
def test_moves_picked_from_allowed_next_never_raise_and_can_always_finish(
    black_box: bool, limits: dict[Progress, int], picks: list[int]
) -> None:
    """Picking only from allowed_next() never raises; a terminal is always at most 2 moves away."""
    machine = KernelProgress(black_box=black_box, error_limits=limits, clock=FakeClock())
    for pick in picks:
        allowed = sorted(machine.allowed_next())
        if not allowed:
            break
        machine.advance(allowed[pick % len(allowed)])
        assert finish(clone(machine)) <= 2
    check_invariants(machine)


Config = tuple[Progress, Progress | None, tuple[tuple[Progress, int], ...]]


def config(machine: KernelProgress) -> Config:
    """All that decides a machine's future: its state, ERROR's origin and its failures."""
    return machine.state, machine.origin, tuple(sorted(machine.errors.items()))


@pytest.mark.parametrize("black_box", [False, True])
# Limits of 2 for every stage make the state space too large to walk; the abort states get 2
# because their loops (ABORTED → USER_REQUESTED_ABORT → ERROR → ABORTED) are the subtle ones.
@pytest.mark.parametrize("abort_limit", [1, 2])
def test_every_reachable_configuration_can_finish(black_box: bool, abort_limit: int) -> None:
    """Exhaustively: allowed_next() is exactly the moves advance() accepts, and all runs can end."""
    start = KernelProgress(
        black_box=black_box,
        error_limits={
            **dict.fromkeys(P, 1),
            P.ABORTED: abort_limit,
            P.USER_REQUESTED_ABORT: abort_limit,
        },
        clock=FakeClock(),
    )
    seen, todo, can_finish = {config(start)}, deque([start]), set[Config]()
    successors: dict[Config, set[Config]] = {}
    while todo:
        machine = todo.popleft()
        allowed, after = machine.allowed_next(), set[Config]()
        for target in P:
            trial = clone(machine)
            try:
                trial.advance(target)
            except ProgressError:
                assert target not in allowed
                continue
            assert target in allowed
            after.add(config(trial))
            if config(trial) not in seen:
                assert len(seen) < 5_000, "the configurations do not stay finite"
                seen.add(config(trial))
                todo.append(trial)
        successors[config(machine)] = after
        if machine.terminal:
            can_finish.add(config(machine))
    changed = True
    while changed:
        before = len(can_finish)
        can_finish |= {k for k, succ in successors.items() if succ & can_finish}
        changed = len(can_finish) != before
    assert can_finish == seen
