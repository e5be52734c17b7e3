"""The two handler kinds of spec document 1, as abstract classes.

A lifecycle handler acts on its targets and sorts them into successes, failures and skips; it
declares its transitions, and the coordinator alone judges retry, expiry and give-up. A
promotion handler does nothing itself: it declares which kernel statuses to check and how
(ALL / ANY / NOT_ANY), and the coordinator promotes the sessions that match, in one query.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from corral.domain.results import HandlerResult, KernelMatchType, StatusTransitions
from corral.domain.session import SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus


class LifecycleHandler(ABC):
    """Acts on the sessions in its target statuses and reports what happened to each."""

    @classmethod
    @abstractmethod
    def name(cls) -> str:
        """The handler's name: its phase in history, its metric label."""

    @property
    @abstractmethod
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        """Sessions in these statuses are its targets."""

    @property
    @abstractmethod
    def target_kernel_statuses(self) -> frozenset[KernelStatus] | None:
        """Only sessions with a kernel in one of these (None: no kernel filter)."""

    @classmethod
    @abstractmethod
    def status_transitions(cls) -> StatusTransitions:
        """Where success, retry, expiry and give-up take a session and its kernels."""

    @abstractmethod
    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        """Act on `targets`; sort them into successes, failures and skips (with notes)."""


class SessionPromotionHandler(ABC):
    """Promotes a session when its kernels meet a condition; kernels are not changed."""

    @classmethod
    @abstractmethod
    def name(cls) -> str:
        """The handler's name: its phase in history, its metric label."""

    @property
    @abstractmethod
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        """Sessions in these statuses are checked."""

    @property
    @abstractmethod
    def check_kernel_statuses(self) -> frozenset[KernelStatus]:
        """The kernel statuses the condition is about."""

    @property
    @abstractmethod
    def match_type(self) -> KernelMatchType:
        """ALL, ANY or NOT_ANY of a session's kernels in `check_kernel_statuses`."""

    @classmethod
    @abstractmethod
    def success_session_status(cls) -> SessionStatus:
        """Where a promoted session goes."""
