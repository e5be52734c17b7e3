"""Retry chains in the store: the ended sessions to decide, the decisions, the chain, the switch.

The retry task (`handlers.sessions.retries`) reads a batch of ended sessions whose retry is not
decided (the partial index `ix_sessions_retry_undecided`), decides them (pure), and in one
transaction records each decision on the parent, guarded by `retry_decision IS NULL` (the
decision is written once, by whichever manager gets there first), and creates the children of
the decisions it recorded. The unique index on (owner, creation_id) stands behind the guard:
a child's creation_id derives from its parent alone, so a second child cannot be created.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.outcome import SUCCESS_ENDING
from corral.domain.record import record
from corral.domain.retry.decide import RetryDecision
from corral.domain.retry.state import ChainLink
from corral.domain.status import SESSION_TERMINAL, SessionStatus
from corral.domain.types import SessionId
from corral.store._direct import DirectStatement
from corral.store._sql import in_constants, in_param, payload
from corral.store.database import Database, Dialect
from corral.store.tables import RETRY_UNDECIDED, cluster_settings, sessions

RETRY_PAUSED = "retry.paused"  # the kill switch's row in cluster_settings

_ENDED = [status.value for status in SESSION_TERMINAL]
# What deciding a session and creating its retry need: the decision's inputs and the parent's
# spec as the store keeps it (`controller.sessions._new_session` wrote it).
_TARGET_COLUMNS = (
    sessions.c.id,
    sessions.c.number,
    sessions.c.name,
    sessions.c.owner_id,
    sessions.c.project,
    sessions.c.type,
    sessions.c.priority,
    sessions.c.resource_group,
    sessions.c.cluster_mode,
    sessions.c.cluster_size,
    sessions.c.spec,
    sessions.c.kernel_slots,
    sessions.c.status,
    sessions.c.result,
    sessions.c.failure_cause,
    sessions.c.exit_code,
    sessions.c.creation_id,
    sessions.c.terminated_at,
    sessions.c.status_changed_at,
    sessions.c.time_limit_s,
    sessions.c.retry_count,
    sessions.c.max_retries,
    sessions.c.retry_policy,
    sessions.c.array_id,
    sessions.c.array_index,
    sessions.c.array_throttle,
)

_UNDECIDED_ENDED = DirectStatement(
    lambda _dialect: (
        sa.select(*_TARGET_COLUMNS)
        .where(sa.text(RETRY_UNDECIDED), in_constants(sessions.c.status, _ENDED))
        .order_by(sessions.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )
)


_ANY_UNDECIDED = DirectStatement(
    lambda _dialect: (
        sa.select(sa.literal(1))
        .select_from(sessions)
        .where(sa.text(RETRY_UNDECIDED), in_constants(sessions.c.status, _ENDED))
        .limit(1)
    )
)


async def any_undecided(conn: AsyncConnection) -> bool:
    """Whether an ended session waits for its retry decision (a read of the partial index:
    in a cluster where no session has a policy, the retry task then writes nothing)."""
    return bool(await _ANY_UNDECIDED.rows(conn))


async def read_undecided(conn: AsyncConnection, limit: int) -> list[Mapping[str, Any]]:
    """Up to `limit` ended sessions with a retry policy whose retry is not decided, oldest id
    first, as rows of `_TARGET_COLUMNS`."""
    rows = await _UNDECIDED_ENDED.rows(conn, {"limit": limit})
    return [row._asdict() for row in rows]


def _successes_statement(_dialect: Dialect) -> sa.Update:
    status, result = SUCCESS_ENDING
    succeeded = sa.and_(
        sa.text(RETRY_UNDECIDED),
        sessions.c.status == status.value,
        sessions.c.result == result.value,
    )
    batch = (
        sa.select(sessions.c.id)
        .where(succeeded)
        .order_by(sessions.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )
    return (
        sessions.update()
        .where(sessions.c.id.in_(batch.scalar_subquery()), succeeded)
        .values(retry_decision=RetryDecision.SUCCEEDED.value)
        .returning(sessions.c.retry_count)
    )


_SUCCESSES = DirectStatement(_successes_statement)


async def record_successes(conn: AsyncConnection, limit: int) -> list[int]:
    """Decide up to `limit` undecided sessions that succeeded, in one statement: SUCCEEDED
    (what `domain.retry.decide` says of any), without reading them; the retry count of each.

    Most ended sessions with a policy succeeded; reading each with its spec to find that out
    cost `corral simulate --retries` a tenth of its time. Guarded like `record_decisions`.
    """
    return [int(count) for count in await _SUCCESSES.scalars(conn, {"limit": limit})]


def _decide_statement(dialect: Dialect) -> sa.Update:
    return (
        sessions.update()
        .where(
            in_param(dialect, sessions.c.id, "ids"),
            sa.text(RETRY_UNDECIDED),
        )
        .values(retry_decision=sa.bindparam("decision", type_=sa.String()))
        .returning(sessions.c.id)
    )


_DECIDE = DirectStatement(_decide_statement)


async def record_decisions(
    conn: AsyncConnection, dialect: Dialect, decisions: Mapping[SessionId, RetryDecision]
) -> set[SessionId]:
    """Write each session's decision where none is written yet; the sessions written.

    On PostgreSQL a concurrent writer of the same row waits for this transaction, then finds
    the decision written and leaves it: the sessions missing from the answer were decided by
    someone else (another manager, a terminate request).
    """
    by_decision: dict[RetryDecision, list[SessionId]] = {}
    for sid, decision in decisions.items():
        by_decision.setdefault(decision, []).append(sid)
    written: set[SessionId] = set()
    for decision, ids in sorted(by_decision.items()):
        params = {"ids": payload(dialect, sorted(ids)), "decision": decision.value}
        written.update(SessionId(sid) for sid in await _DECIDE.scalars(conn, params))
    return written


async def stop_chains(
    db: Database, session_ids: Collection[SessionId]
) -> tuple[bool, list[SessionId]]:
    """Stop the retry chains of these sessions: no attempt of them is retried any more.

    Every attempt of each chain whose retry is undecided (those still running included) is
    marked STOPPED. Returns whether any of them has a chain, and the attempts of the chains
    other than `session_ids`, for the caller to terminate the live ones. Chains are read again
    after the marks: a child a manager created just before them is in the answer, and none can
    be created after them.
    """
    with_chain = await _with_chain(db, session_ids)
    if not with_chain:
        return False, []
    members: set[SessionId] = set()
    for _ in range(2):
        async with db.transaction() as conn:
            members = await _chain_ids(conn, with_chain)
            await conn.execute(
                sessions.update()
                .where(sessions.c.id.in_(sorted(members)), sa.text(RETRY_UNDECIDED))
                .values(retry_decision=RetryDecision.STOPPED.value)
            )
    return True, sorted(members - set(session_ids))


async def _with_chain(db: Database, session_ids: Collection[SessionId]) -> list[SessionId]:
    """The sessions among these that have a retry chain (a policy, or a parent)."""
    if not session_ids:
        return []
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(sessions.c.id).where(
                sessions.c.id.in_(list(session_ids)),
                sa.or_(sessions.c.max_retries > 0, sessions.c.parent_session_id.is_not(None)),
            )
        )
        return [SessionId(sid) for (sid,) in rows]


async def _chain_ids(conn: AsyncConnection, seeds: Sequence[SessionId]) -> set[SessionId]:
    """Every attempt of the chains these sessions are in: ancestors and descendants."""
    s = sessions.c
    up = sa.select(s.id, s.parent_session_id).where(s.id.in_(list(seeds))).cte(recursive=True)
    up = up.union_all(sa.select(s.id, s.parent_session_id).join(up, s.id == up.c.parent_session_id))
    roots = sa.select(up.c.id).where(up.c.parent_session_id.is_(None))
    down = sa.select(s.id).where(s.id.in_(roots)).cte("down", recursive=True)
    down = down.union_all(sa.select(s.id).join(down, s.parent_session_id == down.c.id))
    return {SessionId(sid) for (sid,) in await conn.execute(sa.select(down.c.id))}


@record
class Attempt:
    """One attempt of a chain as `GET /v1/sessions/{id}/attempts` lists it."""

    link: ChainLink
    retry_cause: str | None
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    terminated_at: datetime | None


async def read_chain(db: Database, session_id: SessionId) -> list[Attempt]:
    """The attempts of the chain `session_id` is in, oldest first (just it, without one)."""
    s = sessions.c
    async with db.read() as conn:
        ids = await _chain_ids(conn, [session_id])
        rows = await conn.execute(
            sa.select(
                s.id,
                s.number,
                s.status,
                s.result,
                s.failure_cause,
                s.retry_count,
                s.max_retries,
                s.retry_decision,
                s.starts_at,
                s.retry_cause,
                s.exit_code,
                s.created_at,
                s.started_at,
                s.terminated_at,
            )
            .where(s.id.in_(sorted(ids)))
            .order_by(s.retry_count, s.created_at)
        )
        return [
            Attempt(
                link=ChainLink(
                    id=r.id,
                    number=r.number,
                    status=SessionStatus(r.status),
                    result=r.result,
                    failure_cause=r.failure_cause,
                    retry_count=r.retry_count,
                    max_retries=r.max_retries,
                    retry_decision=r.retry_decision,
                    starts_at=r.starts_at,
                ),
                retry_cause=r.retry_cause,
                exit_code=r.exit_code,
                created_at=r.created_at,
                started_at=r.started_at,
                terminated_at=r.terminated_at,
            )
            for r in rows
        ]


@record
class RetrySwitch:
    """The admins' kill switch: whether automatic retries are paused, since when, by whom."""

    paused: bool = False
    reason: str | None = None
    changed_at: datetime | None = None
    changed_by: str | None = None


_READ_SWITCH = DirectStatement(
    lambda _dialect: sa.select(
        cluster_settings.c.value, cluster_settings.c.updated_at, cluster_settings.c.updated_by
    ).where(cluster_settings.c.name == RETRY_PAUSED)
)


async def read_retry_switch(conn: AsyncConnection) -> RetrySwitch:
    """The switch as stored (not paused when never set)."""
    rows = await _READ_SWITCH.rows(conn)
    if not rows:
        return RetrySwitch()
    value, changed_at, changed_by = rows[0]
    return RetrySwitch(
        paused=bool(value.get("paused")),
        reason=value.get("reason"),
        changed_at=changed_at,
        changed_by=changed_by,
    )


async def write_retry_switch(
    db: Database, *, paused: bool, reason: str | None, by: str, now: datetime
) -> RetrySwitch:
    """Pause or resume automatic retries cluster-wide; the switch as now stored."""
    value = {"paused": paused, "reason": reason}
    async with db.transaction() as conn:
        updated = await conn.execute(
            cluster_settings.update()
            .where(cluster_settings.c.name == RETRY_PAUSED)
            .values(value=value, updated_at=now, updated_by=by)
        )
        if not updated.rowcount:
            await conn.execute(
                cluster_settings.insert().values(
                    name=RETRY_PAUSED, value=value, updated_at=now, updated_by=by
                )
            )
    return RetrySwitch(paused, reason, now, by)
