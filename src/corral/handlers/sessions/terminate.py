"""TerminateSessions: ask the agents to stop the kernels of TERMINATING sessions."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.results import HandlerResult, StatusTransitions, TransitionStatus
from corral.domain.session import KernelIntent, SessionWithKernels
from corral.domain.status import KERNEL_NON_TERMINAL, KernelStatus, SessionStatus
from corral.handlers.base import LifecycleHandler
from corral.handlers.sessions._agents import unavailable_agents
from corral.store.assignments import request_kernels
from corral.store.database import Database


class TerminateSessions(LifecycleHandler):
    """Writes STOP as the desired state of every live kernel of a TERMINATING session.

    Agents stop the kernels and report how each ended; PromoteToTerminated then ends the
    session. The handler's own transitions are the way out when that cannot happen: a session
    with no kernel left on any agent succeeds at once (nothing to stop), one whose agent is not
    ALIVE fails until it gives up, and one an agent never confirms expires; all three end
    TERMINATED with their kernels, releasing what they held.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    def name(cls) -> str:
        return "TerminateSessions"

    @property
    def target_session_statuses(self) -> frozenset[SessionStatus]:
        return frozenset({SessionStatus.TERMINATING})

    @property
    def target_kernel_statuses(self) -> frozenset[KernelStatus] | None:
        return KERNEL_NON_TERMINAL

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        end = TransitionStatus(SessionStatus.TERMINATED, KernelStatus.TERMINATED)
        return StatusTransitions(success=end, need_retry=None, expired=end, give_up=end)

    async def execute(self, targets: Sequence[SessionWithKernels]) -> HandlerResult:
        result = HandlerResult()
        unavailable = await unavailable_agents(self.db, targets)
        stopping = []
        for session in targets:
            live = [k for k in session.kernels if k.status in KERNEL_NON_TERMINAL]
            if session.id in unavailable:
                result.failures.append(session.id)
                result.notes[session.id] = unavailable[session.id]
            elif all(k.agent_id is None for k in live):
                result.successes.append(session.id)
            else:
                stopping.append(session.id)
        if stopping:
            # Idempotent: kernels already asked to stop are not written again.
            async with self.db.transaction() as conn:
                await request_kernels(
                    conn, self.db.dialect, stopping, KernelIntent.STOP, KERNEL_NON_TERMINAL
                )
        return result
