"""The events table: appended in the transaction of the change it records, read by id."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import Event, jsonable_payload
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId
from corral.store._sql import in_values
from corral.store.database import Database, Dialect
from corral.store.tables import events as events_table
from corral.store.tables import sessions

SESSION_STATUS_CHANGED = "session.status_changed"
TOKEN_REVOKED = "token.revoked"  # an API token was deleted: every manager forgets it

_c = events_table.c
# One multi-row INSERT per batch (insertmanyvalues) on both backends. PostgreSQL gets the ids
# back in parameter order from SQLAlchemy. On SQLite SQLAlchemy can only keep that order by
# inserting row by row, but SQLite numbers the rows of a multi-row INSERT in VALUES order under
# its single-writer lock, so the sorted ids are in parameter order.
_INSERT_ORDERED = events_table.insert().returning(_c.id, sort_by_parameter_order=True)
_INSERT = events_table.insert().returning(_c.id)


async def append_events(
    conn: AsyncConnection, events: Sequence[Event], now: datetime
) -> list[Event]:
    """Append `events` in the caller's transaction; return them with their ids, in order.

    Every event is stamped `now` (the time of the change, from the caller's clock), and its
    payload becomes plain JSON values (datetimes as ISO text), exactly as read_events returns it.
    """
    if not events:
        return []
    rows: list[dict[str, Any]] = [
        {
            "kind": event.kind,
            "entity_type": event.entity_type,
            "entity_id": event.entity_id,
            "owner_id": event.owner_id,
            "payload": jsonable_payload(event.payload),
            "created_at": now,
        }
        for event in events
    ]
    if conn.dialect.name == "postgresql":
        ids = list((await conn.execute(_INSERT_ORDERED, rows)).scalars())
    else:
        ids = sorted((await conn.execute(_INSERT, rows)).scalars())
    return [
        replace(event, id=event_id, payload=row["payload"], created_at=now)
        for event, event_id, row in zip(events, ids, rows, strict=True)
    ]


async def read_events(
    db: Database,
    *,
    after_id: int = 0,
    limit: int = 1000,
    owner_id: uuid.UUID | None = None,
    entity_id: str | None = None,
) -> list[Event]:
    """Up to `limit` events with ids above `after_id`, oldest first.

    `owner_id` keeps only that owner's events (what a non-admin may see); `entity_id` keeps
    only one entity's events.
    """
    query = sa.select(events_table).where(_c.id > after_id).order_by(_c.id).limit(limit)
    if owner_id is not None:
        query = query.where(_c.owner_id == owner_id)
    if entity_id is not None:
        query = query.where(_c.entity_id == entity_id)
    async with db.read() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_event(row) for row in rows]


async def read_events_by_id(db: Database, ids: Collection[int]) -> dict[int, Event]:
    """The events with these ids that exist, by id (the event buses fetch large payloads so)."""
    if not ids:
        return {}
    query = sa.select(events_table).where(in_values(db.dialect, _c.id, list(ids)))
    async with db.read() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return {row["id"]: _event(row) for row in rows}


def _event(row: sa.RowMapping) -> Event:
    payload: Any = row["payload"]
    return Event(
        id=row["id"],
        kind=row["kind"],
        entity_type=row["entity_type"],
        entity_id=row["entity_id"],
        owner_id=row["owner_id"],
        payload=payload if payload is not None else {},
        created_at=row["created_at"],
    )


async def append_session_moves(
    conn: AsyncConnection,
    dialect: Dialect,
    moves: Mapping[SessionId, tuple[SessionStatus, SessionStatus]],
    reasons: Mapping[SessionId, str],
    now: datetime,
    *,
    owners: Mapping[SessionId, UserId] | None = None,
) -> list[Event]:
    """Append one `session.status_changed` event per move (with its reason); return them.

    The sessions' owners are read unless `owners` (e.g. from the lock that guarded the moves)
    already names every one.
    """
    if not moves:
        return []
    if owners is None or not owners.keys() >= moves.keys():
        rows = await conn.execute(
            sa.select(sessions.c.id, sessions.c.owner_id).where(
                in_values(dialect, sessions.c.id, list(moves))
            )
        )
        owners = {SessionId(sid): owner for sid, owner in rows}
    return await append_events(
        conn,
        [
            Event(
                kind=SESSION_STATUS_CHANGED,
                entity_type="session",
                entity_id=str(sid),
                owner_id=owners.get(sid),
                payload={"from": before.value, "to": after.value, "reason": reasons.get(sid, "")},
                created_at=now,
            )
            for sid, (before, after) in moves.items()
        ],
        now,
    )
