"""What the lifecycle handlers ask of agents: are they alive, did a stage fail, ask (again)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.failure_causes import FailureCause
from corral.domain.results import HandlerResult, ResultNote
from corral.domain.session import KernelIntent, SessionWithKernels
from corral.domain.status import KERNEL_TERMINAL, KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId
from corral.store.agents import AGENT_ALIVE
from corral.store.assignments import agent_statuses, request_kernels
from corral.store.database import Database, Dialect
from corral.store.status_changes import AppliedChanges

AGENT_UNAVAILABLE = FailureCause.AGENT_UNAVAILABLE


async def unavailable_agents(
    db: Database, targets: Sequence[SessionWithKernels]
) -> dict[SessionId, ResultNote]:
    """The sessions with a live kernel on an agent that is not ALIVE, and why (one query)."""
    wanted = {
        k.agent_id
        for s in targets
        for k in s.kernels
        if k.agent_id is not None and k.status not in KERNEL_TERMINAL
    }
    if not wanted:
        return {}
    async with db.read_statements() as conn:
        statuses = await agent_statuses(conn, db.dialect, wanted)
    notes: dict[SessionId, ResultNote] = {}
    for session in targets:
        for kernel in session.kernels:
            if kernel.agent_id is None or kernel.status in KERNEL_TERMINAL:
                continue
            status = statuses.get(kernel.agent_id, "unknown")
            if status != AGENT_ALIVE:
                notes[session.id] = _note(kernel.agent_id, status)
                break
    return notes


def _note(agent_id: AgentId, status: str) -> ResultNote:
    # Permanent: the manager already waited the heartbeat timeout before calling the agent
    # LOST (or it left), so the phase gives up at once: back to PENDING, placed elsewhere
    # (`failed_agents`), rather than waiting out attempts on an agent that cannot answer.
    return ResultNote(AGENT_UNAVAILABLE, f"agent {agent_id} is {status}, not ALIVE", permanent=True)


def stage_failure_note(session: SessionWithKernels) -> ResultNote | None:
    """Why the agents' last attempt at this session's current stage failed (None: it did not)."""
    for kernel in session.kernels:
        if kernel.stage_failure is not None and kernel.status not in KERNEL_TERMINAL:
            return ResultNote(
                kernel.stage_failure,
                f"kernel {kernel.cluster_index} on agent {kernel.agent_id} failed "
                f"while {kernel.status.value}: {kernel.stage_failure}",
            )
    return None


async def sort_stage_attempts(
    db: Database, targets: Sequence[SessionWithKernels], ready: SessionStatus
) -> HandlerResult:
    """PrepareSessions' and StartSessions' verdict on their targets.

    A session with a live kernel on an agent that is not ALIVE, or whose agents reported the
    current stage failed, is a failed attempt; one in `ready` succeeds (its agents are asked);
    the rest are in progress on their agents, and only expiry applies to them.
    """
    result = HandlerResult()
    unavailable = await unavailable_agents(db, targets)
    for session in targets:
        note = unavailable.get(session.id) or stage_failure_note(session)
        if note is not None:
            result.failures.append(session.id)
            result.notes[session.id] = note
        elif session.status is ready:
            result.successes.append(session.id)
    return result


async def ask_in_stage(
    conn: AsyncConnection,
    dialect: Dialect,
    applied: AppliedChanges,
    stage: SessionStatus,
    intent: KernelIntent,
    kernel_statuses: Collection[KernelStatus],
) -> None:
    """Ask for `intent` again for the sessions still in `stage` after a failed attempt (a new
    generation, the stage failure cleared). Those that just moved there were asked by the move
    itself (`TransitionStatus.ask`)."""
    staying = [sid for sid, (before, after) in applied.sessions.items() if before is after is stage]
    await request_kernels(conn, dialect, staying, intent, kernel_statuses, again=True)
