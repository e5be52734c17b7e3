"""PrepareSessions: ask the agents to prepare the kernels of SCHEDULED sessions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.results import HandlerResult, StatusTransitions, TransitionStatus
from corral.domain.session import KernelIntent, SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.handlers.base import LifecycleHandler
from corral.handlers.sessions._agents import ask_in_stage, sort_stage_attempts
from corral.store.database import Database
from corral.store.status_changes import AppliedChanges

_PREPARING_STAGES = (KernelStatus.PREPARING, KernelStatus.PULLING)


class PrepareSessions(LifecycleHandler):
    """SCHEDULED → PREPARING: the kernels' desired state becomes PREPARE on live agents.

    Also watches PREPARING sessions: an agent that reports a failed preparation makes the
    session's attempt a failure (asked again while attempts remain), and a session stuck in
    preparation expires back to PENDING, to be placed elsewhere.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    def name(cls) -> str:
        return "PrepareSessions"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.SCHEDULED, SessionStatus.PREPARING})

    @property
    def target_kernel_statuses(self) -> frozenset[KernelStatus] | None:
        return None

    @property
    def watched_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.PREPARING})

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        return StatusTransitions(
            success=TransitionStatus(
                SessionStatus.PREPARING, KernelStatus.PREPARING, ask=KernelIntent.PREPARE
            ),
            need_retry=None,
            expired=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
            give_up=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
        )

    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        return await sort_stage_attempts(self.db, targets, SessionStatus.SCHEDULED)

    async def on_applied(self, conn: AsyncConnection, applied: AppliedChanges) -> None:
        await ask_in_stage(
            conn,
            self.db.dialect,
            applied,
            SessionStatus.PREPARING,
            KernelIntent.PREPARE,
            _PREPARING_STAGES,
        )
