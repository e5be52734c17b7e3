"""The law over the handler registry: every declared transition is allowed by the tables."""

from __future__ import annotations

import pytest

from corral.domain.results import KernelMatchType
from corral.domain.status import SESSION_TRANSITIONS, KernelStatus, SessionStatus
from corral.handlers.base import SessionPromotionHandler
from corral.handlers.sessions.promotions import PROMOTION_HANDLERS

S, K = SessionStatus, KernelStatus

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
}


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
    names = [h.name() for h in PROMOTION_HANDLERS]
    assert len(names) == len(set(names))
