"""What the lifecycle handlers ask of agents before acting on a session."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.results import ResultNote
from corral.domain.session import SessionWithKernels
from corral.domain.status import KERNEL_TERMINAL
from corral.domain.types import AgentId, SessionId
from corral.store.assignments import AGENT_ALIVE, agent_statuses
from corral.store.database import Database

AGENT_UNAVAILABLE = "agent_unavailable"


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
    async with db.read() as conn:
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
    return ResultNote(AGENT_UNAVAILABLE, f"agent {agent_id} is {status}, not ALIVE")


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
