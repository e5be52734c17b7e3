"""Kernels their agents have gone quiet about: asked about, then failed with `agent_lost`.

A started kernel (RUNNING, TERMINATING) has no phase timeout of its session's to end a wait
that never ends: a report lost or refused for good left a session RUNNING with its kernel
TERMINATING and its slots held, forever. So each such kernel has a bound: once no word of it
came from its agent for that long (no status change, no confirmation), the manager asks
(`kernels.asked_at`, shown in the agent's assignment, whose revision is bumped); the agent
answers with what it knows (the kernel's current status, its end, or `kernel_lost`), which
any report of the kernel clears (`store.kernel_reports`). A kernel still unanswered past the
answer bound fails with `agent_lost`, its slots released with it, and its session ends as
for a lost agent. Agents that are not ALIVE are the lost sweep's (`store.agent_registry`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.failure_causes import FailureCause
from corral.domain.results import SchedulingResult
from corral.domain.status import KERNEL_STARTED, KernelStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store._sql import in_values
from corral.store.agents import AGENT_ALIVE, apply_slot_deltas
from corral.store.assignments import bump_revisions
from corral.store.database import Database, Dialect
from corral.store.tables import agents, kernel_history, kernels

AGENT_LOST_CAUSE = FailureCause.AGENT_LOST
PHASE_CHECK = "check"  # kernel history phase of a kernel failed for an unanswered ask
# The kernel statuses checked here: started, with no phase timeout of their session's.
CHECKED = KERNEL_STARTED


@dataclass(slots=True)
class KernelChecks:
    """What one check changed."""

    asked: dict[KernelId, AgentId] = field(default_factory=dict)
    failed: dict[KernelId, KernelStatus] = field(default_factory=dict)  # status before ERROR
    sessions: set[SessionId] = field(default_factory=set)  # of the failed kernels


async def check_quiet_kernels(
    db: Database,
    quiet_since: Mapping[KernelStatus, datetime],
    asked_before: datetime,
    now: datetime,
) -> KernelChecks:
    """Ask about every checked kernel quiet since before `quiet_since[status]` on an ALIVE
    agent; fail with `agent_lost` every one asked before `asked_before` and still unanswered.
    One transaction; the agents concerned get their revisions bumped."""
    checks = KernelChecks()
    async with db.transaction() as conn:
        rows = list(await conn.execute(_quiet_kernels(quiet_since, asked_before)))
        to_ask = [r for r in rows if r.asked_at is None]
        to_fail = [r for r in rows if r.asked_at is not None]
        if to_ask:
            await conn.execute(
                kernels.update()
                .where(
                    in_values(db.dialect, kernels.c.id, [r.id for r in to_ask]),
                    kernels.c.asked_at.is_(None),
                )
                .values(asked_at=now)
            )
            checks.asked = {KernelId(r.id): AgentId(r.agent_id) for r in to_ask}
        if to_fail:
            failed = await fail_kernels(
                conn,
                db.dialect,
                to_fail,
                phase=PHASE_CHECK,
                message="its agent did not answer when asked about it",
                now=now,
            )
            checks.failed = {KernelId(r.id): KernelStatus(r.status) for r in failed}
            checks.sessions = {SessionId(r.session_id) for r in failed}
        await bump_revisions(conn, db.dialect, {AgentId(r.agent_id) for r in rows})
    return checks


def _quiet_kernels(
    quiet_since: Mapping[KernelStatus, datetime], asked_before: datetime
) -> sa.Select[Any]:
    k = kernels.c
    quiet = [
        sa.and_(
            k.status == status.value,
            k.asked_at.is_(None),
            k.status_changed_at < since,
            sa.or_(k.heard_at.is_(None), k.heard_at < since),
        )
        for status, since in quiet_since.items()
        if status in CHECKED
    ]
    unanswered = sa.and_(k.asked_at.is_not(None), k.asked_at < asked_before)
    return (
        sa.select(k.id, k.session_id, k.agent_id, k.status, k.occupied_slots, k.asked_at)
        .select_from(kernels.join(agents, agents.c.id == k.agent_id))
        .where(
            agents.c.status == AGENT_ALIVE,
            k.status.in_([s.value for s in CHECKED]),
            sa.or_(unanswered, *quiet),
        )
    )


async def fail_kernels(
    conn: AsyncConnection,
    dialect: Dialect,
    rows: Sequence[Any],
    *,
    phase: str,
    message: str,
    now: datetime,
) -> list[Any]:
    """ERROR `agent_lost` for these kernels (rows of id, session_id, agent_id, status,
    occupied_slots) if still in the status they were read in: history written, slots released.
    The rows failed."""
    if not rows:
        return []
    by_status: dict[str, list[Any]] = {}
    for row in rows:
        by_status.setdefault(row.status, []).append(row)
    failed: list[Any] = []
    for status, group in by_status.items():
        result = await conn.execute(
            kernels.update()
            .where(
                in_values(dialect, kernels.c.id, [r.id for r in group]), kernels.c.status == status
            )
            .values(
                status=KernelStatus.ERROR.value,
                status_changed_at=now,
                failure_cause=AGENT_LOST_CAUSE,
                status_info=message[:512],
                occupied_slots=None,
                stage_failure=None,
                asked_at=None,
            )
            .returning(kernels.c.id)
        )
        moved = {kid for (kid,) in result}
        failed.extend(r for r in group if r.id in moved)
    releases: dict[AgentId, dict[str, int]] = {}
    for row in failed:
        for slot, amount in (row.occupied_slots or {}).items():
            cell = releases.setdefault(AgentId(row.agent_id), {})
            cell[slot] = cell.get(slot, 0) - int(amount)
    if failed:
        await conn.execute(
            kernel_history.insert(),
            [
                {
                    "kernel_id": row.id,
                    "session_id": row.session_id,
                    "phase": phase,
                    "from_status": row.status,
                    "to_status": KernelStatus.ERROR.value,
                    "result": SchedulingResult.SUCCESS.value,
                    "error_code": AGENT_LOST_CAUSE,
                    "message": f"agent {row.agent_id}: {message}",
                    "attempts": 1,
                    "created_at": now,
                    "updated_at": now,
                }
                for row in failed
            ],
        )
        await apply_slot_deltas(conn, releases)
    return failed
