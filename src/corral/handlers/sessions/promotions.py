"""Promotion handlers of the session lifecycle, as spec document 1's table gives them.

Two corral additions, both from DESIGN.md's lifecycles. PromoteToTerminated ends a session in
TERMINATED (it ran), ERROR (a kernel failed; the cause is kept) or CANCELLED (it never ran).
DetectFailureBeforeRunning is a fifth promotion handler for the "kernel failed before running"
edge: a kernel can fail before its session runs (a lost agent, an unrecoverable start), and
the spec's four would only notice once the session reached RUNNING, after starting the healthy
kernels for nothing; a session sent back to PENDING with a failed kernel could never be placed
again. It reacts to ERROR only: a kernel that exited normally ran, and its session passes
RUNNING before it ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.domain.failure_causes import FailureCause
from corral.domain.outcome import REQUESTED_RESULTS, SessionResult
from corral.domain.results import KernelMatchType, ResultNote
from corral.domain.session import KernelState, SessionProgress
from corral.domain.status import (
    KERNEL_NON_TERMINAL,
    KERNEL_NOT_YET_PREPARED,
    KERNEL_NOT_YET_RUNNING,
    KERNEL_TERMINAL,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import SessionId
from corral.handlers.base import Ending, SessionPromotionHandler

KERNEL_FAILED = FailureCause.KERNEL_FAILED


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


class DetectFailureBeforeRunning(SessionPromotionHandler):
    """SCHEDULED … CREATING → TERMINATING as soon as any kernel failed (corral's addition)."""

    @classmethod
    def name(cls) -> str:
        return "DetectFailureBeforeRunning"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset(
            {
                SessionStatus.SCHEDULED,
                SessionStatus.PREPARING,
                SessionStatus.PREPARED,
                SessionStatus.CREATING,
            }
        )

    @property
    def check_kernel_statuses(self) -> frozenset[KernelStatus]:
        return frozenset({KernelStatus.ERROR})

    @property
    def match_type(self) -> KernelMatchType:
        return KernelMatchType.ANY

    @classmethod
    def success_session_status(cls) -> SessionStatus:
        return SessionStatus.TERMINATING


class PromoteToTerminated(SessionPromotionHandler):
    """TERMINATING → TERMINATED, ERROR or CANCELLED once no kernel is still alive."""

    @classmethod
    def name(cls) -> str:
        return "PromoteToTerminated"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.TERMINATING})

    @property
    def check_kernel_statuses(self) -> frozenset[KernelStatus]:
        return KERNEL_NON_TERMINAL

    @property
    def match_type(self) -> KernelMatchType:
        return KernelMatchType.NOT_ANY

    @classmethod
    def success_session_status(cls) -> SessionStatus:
        return SessionStatus.TERMINATED

    def endings(self, promoted: Sequence[SessionProgress]) -> Mapping[SessionId, Ending]:
        return {session.id: session_ending(session) for session in promoted}


def session_ending(session: SessionProgress) -> Ending:
    """How a session whose kernels all ended ends (DESIGN.md "Lifecycles").

    A session that ran and whose end was asked for (a user's terminate, its time limit: the
    cause it carries) ends TERMINATED with that request's result, however its stopped kernels
    exited. Else ERROR if a kernel failed (with its cause); CANCELLED if nothing ever ran; else
    TERMINATED with the deciding kernel's exit code and a result of success exactly when it is
    0. The main kernel decides, unless the manager stopped it because another kernel had ended
    (DetectTermination): then the first kernel that ended by itself decides. A rank that
    finishes a moment before the main one does not fail the session with the signal's exit
    code of the main kernel it cut short. (A kernel that exits non-zero by itself is in ERROR.)
    """
    kernels = sorted(session.kernels, key=lambda k: (k.cluster_role != "main", k.cluster_index))
    ran = session.started_at is not None or any(k.exit_code is not None for k in kernels)
    exit_code = _deciding_exit_code(kernels)
    requested = REQUESTED_RESULTS.get(session.cause) if session.cause is not None else None
    if requested is not None and ran:
        return Ending(SessionStatus.TERMINATED, requested, exit_code)
    failed = [k for k in kernels if k.status is KernelStatus.ERROR]
    if failed:
        cause = failed[0].failure_cause or KERNEL_FAILED
        return Ending(
            SessionStatus.ERROR,
            SessionResult.FAILURE,
            failed[0].exit_code,
            ResultNote(cause, f"kernel {failed[0].cluster_index} failed: {cause}"),
        )
    if not ran:
        return Ending(SessionStatus.CANCELLED, SessionResult.CANCELLED)
    result = SessionResult.SUCCESS if exit_code == 0 else SessionResult.FAILURE
    return Ending(SessionStatus.TERMINATED, result, exit_code)


def _deciding_exit_code(kernels: Sequence[KernelState]) -> int | None:
    """The exit code that decides a session's result (`session_ending`); main kernel first."""
    if not kernels:
        return None
    own = next((k for k in kernels if not k.stopped), kernels[0])
    return own.exit_code


# Where more than one would promote a session, the first wins (`plan_promotions`): a session
# with a failed kernel goes to TERMINATING before it could be promoted past the failure.
PROMOTION_HANDLERS: tuple[SessionPromotionHandler, ...] = (
    DetectFailureBeforeRunning(),
    PromoteToPrepared(),
    PromoteToRunning(),
    DetectTermination(),
    PromoteToTerminated(),
)
