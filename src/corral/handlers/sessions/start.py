"""StartSessions: ask the agents to start the kernels of PREPARED sessions."""

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


class StartSessions(LifecycleHandler):
    """PREPARED → CREATING: the kernels' desired state becomes RUN on live agents.

    Also watches CREATING sessions, as PrepareSessions watches PREPARING ones: a failed start
    reported by an agent is a failed attempt (asked again while attempts remain), and a session
    stuck in creation expires back to PENDING (spec document 1's diagram).
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    def name(cls) -> str:
        return "StartSessions"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.PREPARED, SessionStatus.CREATING})

    @property
    def target_kernel_statuses(self) -> frozenset[KernelStatus] | None:
        return None

    @property
    def watched_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.CREATING})

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        return StatusTransitions(
            success=TransitionStatus(
                SessionStatus.CREATING, KernelStatus.CREATING, ask=KernelIntent.RUN
            ),
            need_retry=None,
            expired=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
            give_up=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
        )

    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        return await sort_stage_attempts(self.db, targets, SessionStatus.PREPARED)

    async def on_applied(self, conn: AsyncConnection, applied: AppliedChanges) -> None:
        await ask_in_stage(
            conn,
            self.db.dialect,
            applied,
            SessionStatus.CREATING,
            KernelIntent.RUN,
            (KernelStatus.CREATING,),
        )
