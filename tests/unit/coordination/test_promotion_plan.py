"""Chained promotions (`plan_promotions`) and the filter that picks which reports need one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from corral.coordination.promotion import plan_promotions
from corral.domain.results import KernelMatchType
from corral.domain.session import KernelState, SessionProgress
from corral.domain.status import SESSION_TERMINAL, SESSION_TRANSITIONS, KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.handlers.sessions.promotions import PROMOTION_HANDLERS

K, S = KernelStatus, SessionStatus
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def session(
    status: SessionStatus, *kernels: tuple[KernelStatus, int | None], started: bool = False
) -> SessionProgress:
    """A session in `status` whose kernel i has the i-th (status, exit code)."""
    return SessionProgress(
        SessionId(uuid.uuid4()),
        status,
        NOW if started else None,
        tuple(
            KernelState(
                "main" if i == 0 else "sub", i, state, code, "oom" if state is K.ERROR else None
            )
            for i, (state, code) in enumerate(kernels)
        ),
    )


def chain(target: SessionProgress) -> list[tuple[str, SessionStatus | None]]:
    """(handler, where it moves the session) for each round that moves `target`."""
    moves = []
    for step in plan_promotions(PROMOTION_HANDLERS, [target], NOW):
        for change in step.changes:
            if target.id in change.session_ids:
                assert change.target is not None
                moves.append((change.phase, change.target.session))
    return moves


def test_a_kernel_that_ran_and_ended_carries_its_session_to_the_end() -> None:
    """CREATING with its only kernel TERMINATED (exit 0): RUNNING, TERMINATING, TERMINATED, each
    by its own handler, and the session counts as started (TERMINATED, not CANCELLED)."""
    target = session(S.CREATING, (K.TERMINATED, 0))
    assert chain(target) == [
        ("PromoteToRunning", S.RUNNING),
        ("DetectTermination", S.TERMINATING),
        ("PromoteToTerminated", S.TERMINATED),
    ]
    [*_, last] = plan_promotions(PROMOTION_HANDLERS, [target], NOW)
    ending = last.endings[target.id]
    assert (ending.status, ending.result, ending.exit_code) == (S.TERMINATED, "success", 0)


def test_a_failed_kernel_wins_over_progress() -> None:
    """PREPARING with one kernel PREPARED and one in ERROR goes to TERMINATING for the failure
    (not to PREPARED first) and stays there while the PREPARED kernel still has to be stopped;
    with the failed kernel alone it ends in ERROR with that kernel's cause."""
    both = session(S.PREPARING, (K.PREPARED, None), (K.ERROR, None))
    assert chain(both) == [("DetectFailureBeforeRunning", S.TERMINATING)]
    alone = session(S.PREPARING, (K.ERROR, None))
    assert chain(alone) == [
        ("DetectFailureBeforeRunning", S.TERMINATING),
        ("PromoteToTerminated", S.ERROR),
    ]
    [*_, last] = plan_promotions(PROMOTION_HANDLERS, [alone], NOW)
    note = last.endings[alone.id].note
    assert note is not None and note.code == "oom"


def test_nothing_is_planned_while_a_kernel_holds_the_session_back() -> None:
    """A kernel still PULLING keeps its session PREPARING; a running sub-kernel only lets the
    session reach TERMINATING once the main kernel ended."""
    assert chain(session(S.PREPARING, (K.PREPARED, None), (K.PULLING, None))) == []
    running = session(S.RUNNING, (K.TERMINATED, 0), (K.RUNNING, None), started=True)
    assert chain(running) == [("DetectTermination", S.TERMINATING)]


def test_rounds_group_the_sessions_by_handler_and_target() -> None:
    """Two sessions promoted alike share one change per round; others get their own."""
    a, b = session(S.CREATING, (K.RUNNING, None)), session(S.CREATING, (K.RUNNING, None))
    c = session(S.PREPARING, (K.PREPARED, None))
    [step] = plan_promotions(PROMOTION_HANDLERS, [a, b, c], NOW)
    assert sorted((ch.phase, sorted(ch.session_ids)) for ch in step.changes) == sorted(
        [("PromoteToRunning", sorted([a.id, b.id])), ("PromoteToPrepared", [c.id])]
    )


_KERNELS = st.lists(st.sampled_from(list(K)), min_size=0, max_size=4)
_ACTIVE = st.sampled_from([s for s in S if s not in SESSION_TERMINAL])


@given(status=_ACTIVE, states=_KERNELS, started=st.booleans())
def test_every_chain_is_legal_and_ends_where_no_handler_applies(
    status: SessionStatus, states: list[KernelStatus], started: bool
) -> None:
    """Each planned move is one the session table allows, from a status its handler targets;
    the chain stops at a terminal status or where no handler would promote any more."""
    target = session(status, *((state, 0) for state in states), started=started)
    current = status
    for phase, to in chain(target):
        handler = next(h for h in PROMOTION_HANDLERS if h.name() == phase)
        assert current in handler.target_session_statuses
        assert to is not None and SESSION_TRANSITIONS.allowed(current, to)
        current = to
    if current not in SESSION_TERMINAL:
        settled = SessionProgress(target.id, current, target.started_at, target.kernels)
        assert not any(h.promotes(settled) for h in PROMOTION_HANDLERS)


@given(
    status=_ACTIVE, others=_KERNELS, before=st.sampled_from(list(K)), after=st.sampled_from(list(K))
)
def test_a_move_that_makes_a_session_promotable_is_never_filtered_out(
    status: SessionStatus, others: list[KernelStatus], before: KernelStatus, after: KernelStatus
) -> None:
    """If a kernel moving from `before` to `after` turns some handler's rule from false to
    true for a session, that handler's `may_become_due(before, after)` says so: the reports
    path never skips a session it could have promoted."""

    def with_kernel(state: KernelStatus) -> SessionProgress:
        return SessionProgress(
            SessionId(uuid.UUID(int=1)),
            status,
            None,
            tuple(KernelState("sub", i, s) for i, s in enumerate([state, *others])),
        )

    for handler in PROMOTION_HANDLERS:
        if handler.promotes(with_kernel(after)) and not handler.promotes(with_kernel(before)):
            assert handler.may_become_due(before, after)


def test_the_match_rules_read_as_the_promotion_query() -> None:
    """ALL: none outside the set; ANY: one inside; NOT_ANY: none inside; no kernels meet ALL
    and NOT_ANY but not ANY."""
    check = frozenset({K.RUNNING})
    assert KernelMatchType.ALL.holds([K.RUNNING, K.RUNNING], check)
    assert not KernelMatchType.ALL.holds([K.RUNNING, K.CREATING], check)
    assert KernelMatchType.ANY.holds([K.CREATING, K.RUNNING], check)
    assert not KernelMatchType.NOT_ANY.holds([K.CREATING, K.RUNNING], check)
    assert KernelMatchType.ALL.holds([], check) and KernelMatchType.NOT_ANY.holds([], check)
    assert not KernelMatchType.ANY.holds([], check)
