"""Sessions as the API shows them: pages, one session with its kernels, its history; removal."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.types import SessionId, UserId
from corral.store._sql import in_values
from corral.store.database import Database
from corral.store.session_removal import ENDED, remove_sessions, waiting_dependants
from corral.store.tables import kernels, session_dependencies, session_history, sessions, users

MAX_PAGE = 1_000


class BadCursorError(ValueError):
    """A pagination cursor this API did not hand out."""


class SessionNotEndedError(ValueError):
    """Only a session that has ended may be removed."""


@record
class SessionFilter:
    """Which sessions a listing shows; `owner_id` None means every owner (admins)."""

    owner_id: UserId | None = None
    statuses: tuple[str, ...] = ()
    resource_group: str | None = None
    type: str | None = None
    array_id: uuid.UUID | None = None  # the elements of one job array
    since: datetime | None = None  # created at or after
    name_prefix: str | None = None  # names starting with it


_COLUMNS = (
    sessions.c.id,
    sessions.c.number,
    sessions.c.name,
    users.c.name.label("owner"),
    sessions.c.owner_id,
    sessions.c.type,
    sessions.c.status,
    sessions.c.status_info,
    sessions.c.status_changed_at,
    sessions.c.created_at,
    sessions.c.started_at,
    sessions.c.terminated_at,
    sessions.c.result,
    sessions.c.failure_cause,
    sessions.c.exit_code,
    sessions.c.resource_group,
    sessions.c.cluster_mode,
    sessions.c.cluster_size,
    sessions.c.priority,
    sessions.c.spec,
    sessions.c.creation_id,
    sessions.c.array_id,
    sessions.c.array_number,
    sessions.c.array_index,
    sessions.c.array_throttle,
    sessions.c.upload,
    sessions.c.time_limit_s,
    sessions.c.deadline_at,
    sessions.c.starts_at,
    sessions.c.parent_session_id,
    sessions.c.retry_count,
    sessions.c.max_retries,
    sessions.c.retry_policy,
    sessions.c.retry_cause,
    sessions.c.retry_decision,
    sessions.c.kernels_ready,
    sessions.c.kernels_ready_reason,
    sessions.c.kernels_ready_at,
    sessions.c.requeue_count,
    sessions.c.requeue_at,
    sessions.c.requeue_active.label("active"),
    sessions.c.evicted_at,
    sessions.c.eviction_reason,
    sessions.c.deactivated_at,
)
_FROM = sessions.join(users, users.c.id == sessions.c.owner_id)


async def list_sessions(
    db: Database, where: SessionFilter, *, limit: int = 100, cursor: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of sessions, newest first, and the cursor of the next page (None: last page)."""
    limit = max(1, min(limit, MAX_PAGE))
    query = sa.select(*_COLUMNS).select_from(_FROM)
    if where.owner_id is not None:
        query = query.where(sessions.c.owner_id == where.owner_id)
    if where.statuses:
        query = query.where(sessions.c.status.in_(where.statuses))
    if where.resource_group is not None:
        query = query.where(sessions.c.resource_group == where.resource_group)
    if where.type is not None:
        query = query.where(sessions.c.type == where.type)
    if where.array_id is not None:
        query = query.where(sessions.c.array_id == where.array_id)
    if where.since is not None:
        query = query.where(sessions.c.created_at >= where.since)
    if where.name_prefix:
        query = query.where(sessions.c.name.startswith(where.name_prefix, autoescape=True))
    if cursor is not None:
        created_at, last_id = _decode(cursor)
        query = query.where(
            sa.or_(
                sessions.c.created_at < created_at,
                sa.and_(sessions.c.created_at == created_at, sessions.c.id < last_id),
            )
        )
    query = query.order_by(sessions.c.created_at.desc(), sessions.c.id.desc()).limit(limit + 1)
    async with db.read() as conn:
        rows = [dict(row._mapping) for row in await conn.execute(query)]
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = _encode(rows[-1]["created_at"], rows[-1]["id"]) if more and rows else None
    return rows, next_cursor


async def array_elements(db: Database, array_id: uuid.UUID) -> list[dict[str, Any]]:
    """A job array's elements by index: each one's id, number, index, status, result, exit
    code, and when it started and ended."""
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(
                sessions.c.id,
                sessions.c.number,
                sessions.c.array_index.label("index"),
                sessions.c.status,
                sessions.c.result,
                sessions.c.exit_code,
                sessions.c.started_at,
                sessions.c.terminated_at,
            )
            .where(sessions.c.array_id == array_id)
            .order_by(sessions.c.array_index)
        )
        return [dict(row._mapping) for row in rows]


async def get_session(db: Database, session_id: uuid.UUID) -> dict[str, Any] | None:
    """One session with its kernels (by cluster index) and the sessions it waits for
    (`dependencies`: depends_on and kind each; a whole array's, one per element)."""
    async with db.read() as conn:
        row = (await conn.execute(_SESSION_BY_ID, {"sid": session_id})).first()
        if row is None:
            return None
        found = dict(row._mapping)
        kernel_rows = await conn.execute(_KERNELS_OF_SESSION, {"sid": session_id})
        found["kernels"] = [dict(k._mapping) for k in kernel_rows]
        waits = await conn.execute(_DEPENDENCIES_OF_SESSION, {"sid": session_id})
        found["dependencies"] = [dict(d._mapping) for d in waits]
    return found


# `get_session` answers every GET of a session: its statements are built once.
_SESSION_BY_ID = (
    sa.select(*_COLUMNS)
    .select_from(_FROM)
    .where(sessions.c.id == sa.bindparam("sid", type_=sessions.c.id.type))
)
_DEPENDENCIES_OF_SESSION = (
    sa.select(session_dependencies.c.depends_on, session_dependencies.c.kind)
    .where(
        session_dependencies.c.session_id
        == sa.bindparam("sid", type_=session_dependencies.c.session_id.type)
    )
    .order_by(session_dependencies.c.depends_on)
)
_KERNELS_OF_SESSION = (
    sa.select(
        kernels.c.id,
        kernels.c.cluster_role,
        kernels.c.cluster_index,
        kernels.c.agent_id,
        kernels.c.status,
        kernels.c.status_info,
        kernels.c.exit_code,
        kernels.c.failure_cause,
        kernels.c.runtime_info,
        kernels.c.status_changed_at,
        kernels.c.restarts,
        kernels.c.restarting,
    )
    .where(kernels.c.session_id == sa.bindparam("sid", type_=kernels.c.session_id.type))
    .order_by(kernels.c.cluster_index)
)


async def session_status(db: Database, session_id: uuid.UUID) -> str | None:
    """The session's status alone (None: no such session)."""
    async with db.read() as conn:
        status = await conn.scalar(sa.select(sessions.c.status).where(sessions.c.id == session_id))
    return None if status is None else str(status)


async def session_history_rows(db: Database, session_id: uuid.UUID) -> list[dict[str, Any]]:
    """The session's scheduling history, oldest first."""
    h = session_history.c
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(
                h.phase,
                h.from_status,
                h.to_status,
                h.result,
                h.error_code,
                h.message,
                h.attempts,
                h.created_at,
                h.updated_at,
            )
            .where(h.session_id == session_id)
            .order_by(h.id)
        )
        return [dict(r._mapping) for r in rows]


async def delete_session(db: Database, session_id: SessionId) -> None:
    """Remove an ended session and everything recorded about it (events stay: the audit log)."""
    await delete_sessions(db, [session_id], what=f"session {session_id}")


async def delete_sessions(db: Database, session_ids: Collection[SessionId], *, what: str) -> int:
    """Remove ended sessions (all or none: SessionNotEndedError naming `what` when one has not
    ended or one that has not ended depends on one of them); how many were removed."""
    async with db.transaction() as conn:
        rows = await conn.execute(
            sa.select(sessions.c.id, sessions.c.status).where(
                in_values(db.dialect, sessions.c.id, list(session_ids))
            )
        )
        found = {SessionId(sid): status for sid, status in rows}
        active = sorted({status for status in found.values() if status not in ENDED})
        if active:
            running = sum(status not in ENDED for status in found.values())
            said = (
                f"{what} is {active[0]}"
                if len(found) == 1
                else (
                    f"{running} of the {len(found)} sessions of {what} have not ended "
                    f"({', '.join(active)})"
                )
            )
            raise SessionNotEndedError(f"{said}; terminate it first, then remove it")
        waiting = await waiting_dependants(conn, db.dialect, found)
        if waiting:
            raise SessionNotEndedError(f"{waiting} session(s) that have not ended depend on {what}")
        await remove_sessions(conn, db.dialect, found, with_events=False)
    return len(found)


def _encode(created_at: datetime, session_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.isoformat(), str(session_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, session_id = json.loads(raw)
        return datetime.fromisoformat(created_at), uuid.UUID(session_id)
    except (ValueError, TypeError) as exc:
        raise BadCursorError("cursor: not a cursor this API handed out") from exc


def kernel_at(found: Mapping[str, Any], index: int) -> Mapping[str, Any] | None:
    """The session's kernel with this cluster index."""
    return next((k for k in found["kernels"] if k["cluster_index"] == index), None)
