"""The law over the handler registry: every declared transition is allowed by the tables."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import pytest

from corral.domain.results import (
    KernelMatchType,
    SchedulingResult,
    StatusTransitions,
    TransitionStatus,
)
from corral.domain.session import KernelIntent
from corral.domain.status import (
    KERNEL_TRANSITIONS,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)
from corral.handlers.base import LifecycleHandler, SessionPromotionHandler
from corral.handlers.sessions.admission import EvictNotReady
from corral.handlers.sessions.prepare import PrepareSessions
from corral.handlers.sessions.promotions import PROMOTION_HANDLERS
from corral.handlers.sessions.schedule import ScheduleNewSessions
from corral.handlers.sessions.start import StartSessions
from corral.handlers.sessions.terminate import TerminateSessions
from corral.store.admission import ADMITTED
from corral.store.database import Database

S, K, R = SessionStatus, KernelStatus, SchedulingResult

# Spec document 1's promotion table, by hand: targets, checked kernel statuses, match, success.
SPEC_PROMOTIONS = {
    "PromoteToPrepared": (
        {S.SCHEDULED, S.PREPARING},
        {K.PENDING, K.SCHEDULED, K.PREPARING, K.PULLING},
        KernelMatchType.NOT_ANY,
        S.PREPARED,
    ),
    "PromoteToRunning": (
        {S.CREATING},
        {K.PENDING, K.SCHEDULED, K.PREPARING, K.PULLING, K.PREPARED, K.CREATING},
        KernelMatchType.NOT_ANY,
        S.RUNNING,
    ),
    "DetectTermination": (
        {S.RUNNING},
        {K.TERMINATED, K.CANCELLED, K.ERROR},
        KernelMatchType.ANY,
        S.TERMINATING,
    ),
    # corral's addition, for DESIGN.md's "kernel failed before running" edge.
    "DetectFailureBeforeRunning": (
        {S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING},
        {K.ERROR},
        KernelMatchType.ANY,
        S.TERMINATING,
    ),
    "PromoteToTerminated": (
        {S.TERMINATING},
        set(K) - {K.TERMINATED, K.CANCELLED, K.ERROR},
        KernelMatchType.NOT_ANY,
        S.TERMINATED,
    ),
}

# Spec document 1's lifecycle handlers: the statuses they act on, and their StatusTransitions.
# StartSessions also watches CREATING (as PrepareSessions watches PREPARING), so a session stuck
# in creation expires back to PENDING as the spec's diagram draws it. `ask` is corral's: the
# kernels a success moves into a stage are asked for it by the move itself.
SPEC_LIFECYCLE = {
    "ScheduleNewSessions": (
        {S.PENDING},
        StatusTransitions(
            success=TransitionStatus(S.SCHEDULED, K.SCHEDULED),
            expired=TransitionStatus(S.CANCELLED, K.CANCELLED),
            give_up=TransitionStatus(S.CANCELLED, K.CANCELLED),
        ),
    ),
    "PrepareSessions": (
        {S.SCHEDULED, S.PREPARING},
        StatusTransitions(
            success=TransitionStatus(S.PREPARING, K.PREPARING, ask=KernelIntent.PREPARE),
            expired=TransitionStatus(S.PENDING, K.PENDING),
            give_up=TransitionStatus(S.PENDING, K.PENDING),
        ),
    ),
    "StartSessions": (
        {S.PREPARED, S.CREATING},
        StatusTransitions(
            success=TransitionStatus(S.CREATING, K.CREATING, ask=KernelIntent.RUN),
            expired=TransitionStatus(S.PENDING, K.PENDING),
            give_up=TransitionStatus(S.PENDING, K.PENDING),
        ),
    ),
    "TerminateSessions": (
        {S.TERMINATING},
        StatusTransitions(
            success=TransitionStatus(S.TERMINATED, K.TERMINATED),
            expired=TransitionStatus(S.TERMINATED, K.TERMINATED),
            give_up=TransitionStatus(S.TERMINATED, K.TERMINATED),
        ),
    ),
}
LIFECYCLE_HANDLERS: list[LifecycleHandler] = [
    ScheduleNewSessions(cast(Database, None), lambda: datetime.now(UTC)),
    PrepareSessions(cast(Database, None)),
    StartSessions(cast(Database, None)),
    TerminateSessions(cast(Database, None)),
]


@pytest.mark.parametrize("handler", LIFECYCLE_HANDLERS, ids=lambda h: h.name())
def test_lifecycle_handlers_match_spec_document_1(handler: LifecycleHandler) -> None:
    """Targets and StatusTransitions of each lifecycle handler are the spec's."""
    targets, transitions = SPEC_LIFECYCLE[handler.name()]
    assert handler.target_session_statuses == targets
    assert handler.status_transitions() == transitions


@pytest.mark.parametrize("handler", LIFECYCLE_HANDLERS, ids=lambda h: h.name())
@pytest.mark.parametrize("outcome", [R.SUCCESS, R.NEED_RETRY, R.EXPIRED, R.GIVE_UP])
def test_every_lifecycle_transition_is_allowed_by_the_tables(
    handler: LifecycleHandler, outcome: R
) -> None:
    """A registered lifecycle handler can only declare moves the session and kernel tables allow."""
    move = handler.status_transitions().for_result(outcome)
    if move is None:
        return
    if move.session is not None:
        SESSION_TRANSITIONS.check(handler.target_session_statuses - {move.session}, move.session)
    if move.kernel is not None:
        assert KERNEL_TRANSITIONS.sources(move.kernel), move.kernel


@pytest.mark.parametrize("handler", PROMOTION_HANDLERS, ids=lambda h: h.name())
def test_every_promotion_is_allowed_by_the_session_table(handler: SessionPromotionHandler) -> None:
    """A registered promotion handler can only declare moves the session table allows."""
    SESSION_TRANSITIONS.check(
        handler.target_session_statuses - {handler.success_session_status()},
        handler.success_session_status(),
    )


@pytest.mark.parametrize("handler", PROMOTION_HANDLERS, ids=lambda h: h.name())
def test_promotions_match_spec_document_1(handler: SessionPromotionHandler) -> None:
    """Targets, checked kernel statuses, match type and success status are the spec's."""
    targets, checked, match, success = SPEC_PROMOTIONS[handler.name()]
    assert handler.target_session_statuses == targets
    assert handler.check_kernel_statuses == checked
    assert handler.match_type is match
    assert handler.success_session_status() is success


def test_handler_names_are_unique() -> None:
    """Names are phases in history: two handlers may not share one."""
    names = [h.name() for h in (*LIFECYCLE_HANDLERS, *PROMOTION_HANDLERS)]
    assert len(names) == len(set(names))


def test_evict_not_ready_declares_only_moves_the_tables_allow() -> None:
    """All-or-nothing admission's task: admitted sessions evicted back to PENDING (their
    kernels too), deactivated PENDING ones cancelled past their retention."""
    transitions = EvictNotReady.status_transitions()
    assert transitions.expired == TransitionStatus(S.PENDING, K.PENDING)
    SESSION_TRANSITIONS.check(ADMITTED, S.PENDING)
    assert K.RUNNING in KERNEL_TRANSITIONS.sources(K.PENDING)
    assert transitions.give_up == TransitionStatus(S.CANCELLED, K.CANCELLED)
    SESSION_TRANSITIONS.check(S.PENDING, S.CANCELLED)
    assert EvictNotReady.name() not in {h.name() for h in LIFECYCLE_HANDLERS}
