"""Why a session is (not) placed: a dry-run pass over its group, read-only."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from corral.domain.outcome import INVALID_REQUEST
from corral.domain.record import record
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.scheduler.planner import place_sessions
from corral.scheduler.snapshot import load_snapshot
from corral.scheduler.types import Outcome, Plan
from corral.store.database import Database
from corral.store.group_options import GroupOptions, group_options
from corral.store.tables import sessions


class SessionNotFoundError(LookupError):
    """No session with that id."""


@record
class Explanation:
    """Where a session stands in its group's queue and why it is (not) placed."""

    session_id: uuid.UUID
    status: SessionStatus
    resource_group: str
    position: int | None  # 1-based place among the group's candidates; None if not a candidate
    queue_length: int
    outcome: str  # placed / failed / waiting / blocked / not_pending / not_due
    code: str
    message: str

    @property
    def reason(self) -> str:
        """The explanation in a word, as `session ls` shows it: the code, else the outcome."""
        return self.code or self.outcome

    def as_json(self) -> dict[str, object]:
        return {
            "session_id": str(self.session_id),
            "status": self.status.value,
            "resource_group": self.resource_group,
            "position": self.position,
            "queue_length": self.queue_length,
            "outcome": self.outcome,
            "code": self.code,
            "message": self.message,
        }


async def explain(db: Database, session_id: uuid.UUID, now: datetime) -> Explanation:
    """Run placement for the session's group without committing, and report on the session."""
    found = await explain_many(db, [session_id], now)
    if session_id not in found:
        raise SessionNotFoundError(f"no session {session_id}")
    return found[session_id]


async def explain_many(
    db: Database, session_ids: Collection[uuid.UUID], now: datetime
) -> dict[uuid.UUID, Explanation]:
    """`explain` for several sessions (missing ids left out): one dry-run pass per group."""
    if not session_ids:
        return {}
    async with db.read() as conn:
        rows = (
            await conn.execute(
                sa.select(
                    sessions.c.id,
                    sessions.c.status,
                    sessions.c.resource_group,
                    sessions.c.status_info,
                    sessions.c.requeue_at,
                    sessions.c.starts_at,
                    sessions.c.requeue_active,
                    sessions.c.requeue_count,
                ).where(sessions.c.id.in_(list(session_ids)))
            )
        ).all()
        limits = await group_options(db, conn)
    plans: dict[str, Plan] = {}
    found: dict[uuid.UUID, Explanation] = {}
    for row in rows:
        early = _without_placement(row, now, limits)
        if early is not None:
            found[row.id] = early
            continue
        plan = plans.get(row.resource_group)
        if plan is None:
            plan = plans[row.resource_group] = place_sessions(
                await load_snapshot(db, row.resource_group, now)
            )
        found[row.id] = _from_plan(row, plan)
    return found


def _base(row: Any) -> dict[str, Any]:
    return {
        "session_id": row.id,
        "status": SessionStatus(row.status),
        "resource_group": row.resource_group,
    }


def _of_limit(limits: GroupOptions, group: str) -> str:
    """ " of N" for a group whose requeues are limited to N, else nothing."""
    stored = limits.get(group) or {}
    wait = ResourceGroupOptions.model_validate(stored).wait_for_kernels_ready
    count = wait.requeuing.backoff_limit_count
    return "" if count is None else f" of {count}"


def _without_placement(row: Any, now: datetime, limits: GroupOptions) -> Explanation | None:
    """The explanation of a session placement need not be run for (not pending, not due)."""
    status = SessionStatus(row.status)
    base = _base(row)
    if status is not SessionStatus.PENDING:
        return Explanation(
            **base,
            position=None,
            queue_length=0,
            outcome="not_pending",
            code="",
            message=f"the session is {status.value}, not waiting to be placed"
            + (f": {row.status_info}" if row.status_info else ""),
        )
    if row.requeue_active and row.requeue_at is not None and row.requeue_at > now:
        return Explanation(
            **base,
            position=None,
            queue_length=0,
            outcome="not_due",
            code="requeue_at",
            message=f"backing off until {row.requeue_at.isoformat()} "
            f"(requeue {row.requeue_count}{_of_limit(limits, row.resource_group)}): its "
            "kernels were not all ready in time",
        )
    for field, what in (("starts_at", "its start time"),):
        when = getattr(row, field)
        if when is not None and when > now:
            return Explanation(
                **base,
                position=None,
                queue_length=0,
                outcome="not_due",
                code=field,
                message=f"not a candidate until {when.isoformat()} ({what})",
            )
    if not row.requeue_active:
        return Explanation(
            **base,
            position=None,
            queue_length=0,
            outcome="not_due",
            code="deactivated",
            message="deactivated: its kernels were not all ready in time too often; "
            "`corral session activate` queues it again",
        )
    return None


def _from_plan(row: Any, plan: Plan) -> Explanation:
    base = _base(row)
    decision = plan.decisions.get(SessionId(row.id))
    invalid = plan.invalid.get(SessionId(row.id))
    if invalid is not None:
        return Explanation(
            **base,
            position=None,
            queue_length=len(plan.order),
            outcome=Outcome.FAILED.value,
            code=INVALID_REQUEST,
            message=f"its stored request cannot be placed ({invalid}); the next pass fails it",
        )
    if decision is None:
        return Explanation(
            **base,
            position=None,
            queue_length=len(plan.order),
            outcome="not_due",
            code="not_candidate",
            message="not among the group's candidates right now",
        )
    message = decision.message
    if decision.outcome is Outcome.PLACED:
        message = f"fits now ({message}); it will be placed on the next pass"
    return Explanation(
        **base,
        position=decision.position,
        queue_length=len(plan.order),
        outcome=decision.outcome.value,
        code=decision.code,
        message=message,
    )
