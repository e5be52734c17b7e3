"""PrepareSessions: ask the agents to prepare the kernels of SCHEDULED sessions."""

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

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        return StatusTransitions(
            success=TransitionStatus(SessionStatus.PREPARING, KernelStatus.PREPARING),
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
            elif session.status is SessionStatus.SCHEDULED:
                result.successes.append(session.id)
            # else: PREPARING and in progress on its agents; only expiry applies.
        return result

    async def on_applied(self, conn: AsyncConnection, applied: AppliedChanges) -> None:
        # Newly PREPARING, or still PREPARING after a failed attempt: ask (again) to PREPARE.
        preparing = [
            sid for sid, (_, after) in applied.sessions.items() if after is SessionStatus.PREPARING
        ]
        await request_kernels(
            conn, self.db.dialect, preparing, KernelIntent.PREPARE, _PREPARING_STAGES, again=True
        )
