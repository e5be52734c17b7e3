"""The events table: appended in the transaction of the change it records, read by id."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import Event, jsonable_payload
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId
from corral.store._direct import DirectStatement, insert_columns
from corral.store._sql import in_values
from corral.store.database import Database, Dialect
from corral.store.tables import events as events_table
from corral.store.tables import sessions

SESSION_STATUS_CHANGED = "session.status_changed"
TOKEN_REVOKED = "token.revoked"  # an API token was deleted: every manager forgets it

_c = events_table.c


# PostgreSQL: the batch as one array per column, inserted in parameter order.
_PG_APPEND = (
    "INSERT INTO events (kind, entity_type, entity_id, owner_id, payload, created_at) "
    "SELECT kind, entity_type, entity_id, owner_id, CAST(payload AS JSONB), :now "
    "FROM unnest(CAST(:kinds AS VARCHAR[]), CAST(:types AS VARCHAR[]), "
    "CAST(:entities AS VARCHAR[]), CAST(:owners AS UUID[]), CAST(:payloads AS TEXT[])) "
    "WITH ORDINALITY AS batch (kind, entity_type, entity_id, owner_id, payload, n) "
    "ORDER BY n"
)


def _pg_insert(_dialect: Dialect) -> sa.TextualSelect:
    """PostgreSQL: one INSERT of a whole batch from one array parameter per column, returning
    the new ids. The statement is the same for any batch size: built and compiled once, run
    directly. Rows are inserted in parameter order (ORDER BY) and the sequence is drawn row by
    row, so the sorted ids are in parameter order.
    """
    now = sa.bindparam("now", type_=_c.created_at.type)
    return sa.text(_PG_APPEND + " RETURNING id").bindparams(now).columns(id=_c.id.type)


_INSERT = DirectStatement(_pg_insert)
# SQLite: the batch with ids of its own, numbered on from the newest event's. A writer holds
# SQLite's write lock for its whole transaction, so nothing else appends in between; and SQLite
# would number the rows so itself (a rowid table takes the largest rowid plus one). Knowing the
# ids, the rows go in one executemany, with no RETURNING to step through: 25 % less time than
# one INSERT ... SELECT from a JSON array returning the ids (160,000 events in batches of
# 4,000, ids ordered by time as session ids are: 0.69 s against 0.89 s).
_NEWEST_ID = DirectStatement(lambda _dialect: sa.select(sa.func.coalesce(sa.func.max(_c.id), 0)))
_ROW_COLUMNS = ("id", "kind", "entity_type", "entity_id", "owner_id", "payload", "created_at")
_INSERT_ROWS = insert_columns(events_table, _ROW_COLUMNS)

# The largest notification sent whole; a larger one carries only the event's id, and listeners
# read the row (PostgreSQL's own limit is 8,000 bytes).
NOTIFY_LIMIT_BYTES = 7_000


def _bulk_insert_notifying(_dialect: Dialect) -> sa.TextualSelect:
    """PostgreSQL: `_pg_insert` that also NOTIFYs `:channel` of each event, in id order.

    The notifications go out when the transaction commits, as the event bus would have sent
    them after it, each the event's JSON as `Event.to_json` writes it, or `{"id": N}` when that
    is too large. A submission or a coordinator run so saves the statement `publish` took.
    (pg_notify is volatile, so PostgreSQL calls it after the sort, in id order.)
    """
    now = sa.bindparam("now", type_=_c.created_at.type)
    return (
        sa.text(
            "WITH appended AS (" + _PG_APPEND + " RETURNING id, kind, entity_type, entity_id,"
            " owner_id, payload, created_at"
            "), described AS ("
            " SELECT id, json_build_object('id', id, 'kind', kind, 'entity_type', entity_type,"
            " 'entity_id', entity_id, 'owner_id', owner_id, 'payload', payload,"
            " 'created_at', created_at)::text AS whole FROM appended"
            ") SELECT id, pg_notify(:channel, CASE WHEN octet_length(whole) <= :limit"
            " THEN whole ELSE json_build_object('id', id)::text END) AS notified"
            " FROM described ORDER BY id"
        )
        .bindparams(now, sa.bindparam("limit", NOTIFY_LIMIT_BYTES, type_=sa.Integer()))
        .columns(id=_c.id.type)
    )


_INSERT_NOTIFYING = DirectStatement(_bulk_insert_notifying)


async def append_events(
    conn: AsyncConnection, events: Sequence[Event], now: datetime, *, notify: str | None = None
) -> list[Event]:
    """Append `events` in the caller's transaction; return them with their ids, in order.

    Every event is stamped `now` (the time of the change, from the caller's clock), and its
    payload becomes plain JSON values (datetimes as ISO text), exactly as read_events returns it.
    `notify`: on PostgreSQL, the event bus's `commit_channel`, which then delivers the events at
    commit (the caller must not publish them); ignored on SQLite.
    """
    return await _append(
        conn,
        [(e.kind, e.entity_type, e.entity_id, e.owner_id, e.payload) for e in events],
        now,
        notify,
    )


# An event to append: kind, entity type, entity id, owner id, payload.
_NewEvent = tuple[str, str, str, uuid.UUID | None, Mapping[str, Any]]


async def _append(
    conn: AsyncConnection, events: Sequence[_NewEvent], now: datetime, notify: str | None
) -> list[Event]:
    """`append_events` of events given as tuples (an Event is made once, with its id)."""
    if not events:
        return []
    # Events often share a payload object (`append_session_moves`: one per kind of move); each
    # is made plain once, and shared on, so the insert encodes it to JSON once.
    payloads = _each_once([event[4] for event in events], jsonable_payload)
    if conn.dialect.name == "postgresql":
        params: dict[str, Any] = {
            "now": now,
            "kinds": [event[0] for event in events],
            "types": [event[1] for event in events],
            "entities": [event[2] for event in events],
            "owners": [event[3] for event in events],
            "payloads": _each_once(payloads, json.dumps),
        }
        statement = _INSERT
        if notify is not None:
            statement = _INSERT_NOTIFYING
            params["channel"] = notify
        ids = sorted(await statement.scalars(conn, params))
    else:
        first = (await _NEWEST_ID.scalars(conn))[0] + 1
        ids = list(range(first, first + len(events)))
        await _INSERT_ROWS.run_rows(
            conn,
            _ROW_COLUMNS,
            [
                (event_id, kind, etype, entity, owner, p, now)
                for (kind, etype, entity, owner, _), event_id, p in zip(
                    events, ids, payloads, strict=True
                )
            ],
        )
    return [
        Event(
            id=event_id,
            kind=kind,
            entity_type=etype,
            entity_id=entity,
            owner_id=owner,
            payload=p,
            created_at=now,
        )
        for (kind, etype, entity, owner, _), event_id, p in zip(events, ids, payloads, strict=True)
    ]


def _each_once(values: Sequence[Any], convert: Callable[[Any], Any]) -> list[Any]:
    """`convert` of each value, run once per distinct object (a payload several events share);
    `values` holds every object meanwhile, so no id is reused."""
    done: dict[int, Any] = {}
    out = []
    for value in values:
        found = done.get(id(value), _NOT_YET)
        if found is _NOT_YET:
            found = done[id(value)] = convert(value)
        out.append(found)
    return out


_NOT_YET = object()


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
    async with db.read_statements() as conn:
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
    notify: str | None = None,
) -> list[Event]:
    """Append one `session.status_changed` event per move (with its reason); return them.

    The sessions' owners are read unless `owners` (e.g. from the lock that guarded the moves)
    already names every one. `notify`: as for `append_events`.
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
    # One payload object per kind of move, shared by its events (read-only, as every payload).
    payloads: dict[tuple[SessionStatus, SessionStatus, str], dict[str, str]] = {}
    events: list[_NewEvent] = []
    for sid, (before, after) in moves.items():
        reason = reasons.get(sid, "")
        found = payloads.get((before, after, reason))
        if found is None:
            found = payloads[before, after, reason] = {
                "from": before.value,
                "to": after.value,
                "reason": reason,
            }
        events.append((SESSION_STATUS_CHANGED, "session", str(sid), owners.get(sid), found))
    return await _append(conn, events, now, notify)
