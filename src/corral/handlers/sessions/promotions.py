"""Promotion handlers of the session lifecycle, exactly as spec document 1's table gives them.

PromoteToTerminated is not here yet: corral ends a session in TERMINATED, ERROR (a kernel
failed) or CANCELLED (it never ran), so its promotion comes with the terminate flow.
"""

from __future__ import annotations

from corral.domain.results import KernelMatchType
from corral.domain.status import (
    KERNEL_NOT_YET_PREPARED,
    KERNEL_NOT_YET_RUNNING,
    KERNEL_TERMINAL,
    KernelStatus,
    SessionStatus,
)
from corral.handlers.base import SessionPromotionHandler


class PromoteToPrepared(SessionPromotionHandler):
    """SCHEDULED/PREPARING → PREPARED once no kernel is still pending, scheduled or preparing."""

    @classmethod
    def name(cls) -> str:
        return "PromoteToPrepared"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.SCHEDULED, SessionStatus.PREPARING})

    @property
    def check_kernel_statuses(self) -> frozenset[KernelStatus]:
        return KERNEL_NOT_YET_PREPARED

    @property
    def match_type(self) -> KernelMatchType:
        return KernelMatchType.NOT_ANY

    @classmethod
    def success_session_status(cls) -> SessionStatus:
        return SessionStatus.PREPARED


class PromoteToRunning(SessionPromotionHandler):
    """CREATING → RUNNING once no kernel is still before RUNNING."""

    @classmethod
    def name(cls) -> str:
        return "PromoteToRunning"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.CREATING})

    @property
    def check_kernel_statuses(self) -> frozenset[KernelStatus]:
        return KERNEL_NOT_YET_RUNNING

    @property
    def match_type(self) -> KernelMatchType:
        return KernelMatchType.NOT_ANY

    @classmethod
    def success_session_status(cls) -> SessionStatus:
        return SessionStatus.RUNNING


class DetectTermination(SessionPromotionHandler):
    """RUNNING → TERMINATING as soon as any kernel has ended."""

    @classmethod
    def name(cls) -> str:
        return "DetectTermination"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.RUNNING})

    @property
    def check_kernel_statuses(self) -> frozenset[KernelStatus]:
        return KERNEL_TERMINAL

    @property
    def match_type(self) -> KernelMatchType:
        return KernelMatchType.ANY

    @classmethod
    def success_session_status(cls) -> SessionStatus:
        return SessionStatus.TERMINATING


PROMOTION_HANDLERS: tuple[SessionPromotionHandler, ...] = (
    PromoteToPrepared(),
    PromoteToRunning(),
    DetectTermination(),
)
