"""StartSessions: ask the agents to start the kernels of PREPARED sessions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.results import HandlerResult, StatusTransitions, TransitionStatus
from corral.domain.session import KernelIntent, SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.handlers.base import LifecycleHandler
from corral.handlers.sessions._agents import stage_failure_note, unavailable_agents
from corral.store.assignments import request_kernels
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

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        return StatusTransitions(
            success=TransitionStatus(SessionStatus.CREATING, KernelStatus.CREATING),
            need_retry=None,
            expired=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
            give_up=TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING),
        )

    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        result = HandlerResult()
        unavailable = await unavailable_agents(self.db, targets)
        for session in targets:
            note = unavailable.get(session.id) or stage_failure_note(session)
            if note is not None:
                result.failures.append(session.id)
                result.notes[session.id] = note
            elif session.status is SessionStatus.PREPARED:
                result.successes.append(session.id)
            # else: CREATING and in progress on its agents; only expiry applies.
        return result

    async def on_applied(self, conn: AsyncConnection, applied: AppliedChanges) -> None:
        # Newly CREATING, or still CREATING after a failed attempt: ask (again) to RUN.
        creating = [
            sid for sid, (_, after) in applied.sessions.items() if after is SessionStatus.CREATING
        ]
        await request_kernels(
            conn, self.db.dialect, creating, KernelIntent.RUN, (KernelStatus.CREATING,), again=True
        )
