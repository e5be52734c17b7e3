"""The two handler kinds of spec document 1, as abstract classes.

A lifecycle handler acts on its targets and sorts them into successes, failures and skips; it
declares its transitions, and the coordinator alone judges retry, expiry and give-up. A
promotion handler does nothing itself: it declares which kernel statuses to check and how
(ALL / ANY / NOT_ANY), and the coordinator promotes the sessions that match, in one query.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.outcome import SessionResult
from corral.domain.record import record
from corral.domain.results import HandlerResult, KernelMatchType, ResultNote, StatusTransitions
from corral.domain.session import SessionProgress, SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.store.status_changes import AppliedChanges


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

    @property
    def watched_session_statuses(self) -> frozenset[SessionStatus]:
        """Target statuses in which a session is in progress on its agents (none by default).

        The handler acts on such a session only when one of its live kernels is on an agent
        that is not ALIVE or has a stage failure reported, or when its phase may have expired;
        otherwise it would be judged "no change". The coordinator loads only those, so a run
        costs what changed, not every session that waits on its agents.
        """
        return frozenset()

    # True when `execute` itself commits its successes (the scheduler's placement commit):
    # the coordinator then judges and applies only the rest.
    commits_successes: ClassVar[bool] = False
    # True when `execute` reads its targets itself, as far as it needs to (the scheduler reads
    # each group's queue a page at a time, until a session blocks the rest): the coordinator
    # calls it with no targets, and judges the sessions it reports in `considered` together
    # with those in the target statuses that may have expired (read by the coordinator).
    reads_own_targets: ClassVar[bool] = False

    # True when the handler has work that comes due at a time no hint announces besides its
    # phase's timeout (the scheduler: start times, requeue backoffs): see `next_due`.
    reports_due_times: ClassVar[bool] = False

    @abstractmethod
    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        """Act on `targets`; sort them into successes, failures and skips (with notes)."""

    async def next_due(self, conn: AsyncConnection, now: datetime) -> datetime | None:
        """The earliest moment after `now` at which this handler has new work that no hint
        will announce (phase timeouts aside: the coordinator tracks those); None by default."""
        return None

    async def on_applied(self, conn: AsyncConnection, applied: AppliedChanges) -> None:
        """Runs inside the transaction that applies the judged result, after the moves.

        The place for writes that must commit together with the statuses, such as the
        kernels' desired state for the agents. Nothing by default.
        """
        return None


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

    def promotes(self, session: SessionProgress) -> bool:
        """Whether this handler promotes `session` as it stands: its promotion query's rule."""
        targets, check, match = self._rule()
        return session.status in targets and match.holds(
            (kernel.status for kernel in session.kernels), check
        )

    def _rule(self) -> tuple[frozenset[SessionStatus], frozenset[KernelStatus], KernelMatchType]:
        """The handler's rule, read from its properties once: a handler's rule never changes,
        and `plan_promotions` asks every handler of every session on every report."""
        rule = self.__dict__.get("_cached_rule")
        if rule is None:
            rule = self.__dict__["_cached_rule"] = (
                self.target_session_statuses,
                self.check_kernel_statuses,
                self.match_type,
            )
        return rule

    def may_become_due(self, before: KernelStatus, after: KernelStatus) -> bool:
        """Whether a kernel moving from `before` to `after` can make a session of this
        handler's targets promotable where it was not."""
        _, check, match = self._rule()
        return match.may_start_holding(before, after, check)

    def endings(self, promoted: Sequence[SessionProgress]) -> Mapping[SessionId, Ending]:
        """Per promoted session, a different end than `success_session_status` (default none).

        Only PromoteToTerminated uses it: a session ends TERMINATED, ERROR or CANCELLED.
        """
        return {}


@record
class Ending:
    """How a session ends: its terminal status, result, exit code and (for ERROR) the cause."""

    status: SessionStatus
    result: SessionResult
    exit_code: int | None = None
    note: ResultNote | None = None
