"""`/v1/retries`: the cluster's automatic retries: their default policy and the kill switch.

Anyone may read whether retries are paused (a session's `retry_state` says so too); only an
admin may pause or resume them. The switch is a row in the database (`cluster_settings`), so
every manager stops deciding retries at its next run, whichever manager was asked.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, StrictBool

from corral.api.auth import AdminUser, CurrentUser, Db
from corral.controller.sessions import SessionController
from corral.coordination.hints import Hint
from corral.domain.retry.policy import RetryPolicy
from corral.store.retries import RetrySwitch, read_retry_switch, write_retry_switch

router = APIRouter(prefix="/v1/retries", tags=["retries"])


class RetriesOut(BaseModel):
    """Whether automatic retries are paused, and the cluster's default policy."""

    paused: bool
    reason: str | None
    changed_at: datetime | None
    changed_by: str | None
    # The cluster layer of every session's policy (the manager's retry_policy_default).
    cluster_default: RetryPolicy


class RetriesChange(BaseModel):
    """Pause (true) or resume (false) automatic retries, saying why."""

    paused: StrictBool
    reason: str | None = Field(default=None, max_length=256)


def _out(switch: RetrySwitch, request: Request) -> RetriesOut:
    sessions: SessionController = request.app.state.sessions
    return RetriesOut(
        paused=switch.paused,
        reason=switch.reason,
        changed_at=switch.changed_at,
        changed_by=switch.changed_by,
        cluster_default=sessions.retry_default,
    )


@router.get("", response_model=RetriesOut, operation_id="get_retries")
async def retries_get(user: CurrentUser, db: Db, request: Request) -> RetriesOut:
    """Whether automatic retries are paused cluster-wide, and the default policy."""
    async with db.read() as conn:
        switch = await read_retry_switch(conn)
    return _out(switch, request)


@router.put("", response_model=RetriesOut, operation_id="set_retries")
async def retries_put(
    body: RetriesChange, admin: AdminUser, db: Db, request: Request
) -> RetriesOut:
    """Pause or resume automatic retries cluster-wide (admins): the kill switch of a storm.

    While paused, failed sessions wait for their retry decision; resuming decides them.
    """
    sessions: SessionController = request.app.state.sessions
    switch = await write_retry_switch(
        db, paused=body.paused, reason=body.reason, by=admin.name, now=sessions.clock()
    )
    if not switch.paused:
        await sessions.hints.set_after_commit(Hint.RETRY.value)
    return _out(switch, request)
