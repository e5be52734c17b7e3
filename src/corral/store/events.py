"""The events table: appended in the transaction of the change it records, read by id."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import SESSION_ENTITY, Event, jsonable_payload
from corral.domain.record import record
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId
from corral.store._direct import DirectStatement, insert_columns
from corral.store._json import dumps
from corral.store._sql import in_values
from corral.store.database import Database, Dialect
from corral.store.tables import events as events_table
from corral.store.tables import sessions

SESSION_STATUS_CHANGED = "session.status_changed"
TOKEN_REVOKED = "token.revoked"  # an API token was deleted: every manager forgets it
# A user was removed (their tokens with them) or their role changed: every manager forgets
# what it kept of tokens, as for a revocation.
USER_REMOVED = "user.removed"
USER_ROLE_CHANGED = "user.role_changed"
# The kinds after which a manager's token cache may hold a token that no longer means the same.
TOKEN_CHANGES = (TOKEN_REVOKED, USER_REMOVED, USER_ROLE_CHANGED)

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

# The largest NOTIFY payload sent (PostgreSQL's own limit is 8,000 bytes).
NOTIFY_LIMIT_BYTES = 7_000
# An append of at most this many events NOTIFYs each whole: a subscriber gets them without
# reading them back (a manager at 100 submissions/s appends a few at a time, and reading each
# batch back added 14-20 ms to the p50 of `corral bench latency` on PostgreSQL). A larger append
# sends notices (`EventNotice`).
WHOLE_EVENTS_MAX = 64
# A notice's list of kinds longer than this says "any kind" instead (kinds are short names).
_KINDS_LIMIT_BYTES = 1_000

# One statement: the payloads NOTIFYed in order (pg_notify is volatile, so PostgreSQL calls it
# after the sort). In a transaction they go out when it commits.
_NOTIFY = DirectStatement(
    lambda _dialect: sa.text(
        "SELECT pg_notify(:channel, payload)"
        " FROM unnest(CAST(:payloads AS text[])) WITH ORDINALITY AS t(payload, n) ORDER BY n"
    )
)


async def send_notifications(conn: AsyncConnection, channel: str, payloads: Sequence[str]) -> None:
    """PostgreSQL: NOTIFY `channel` of each payload, in order (at commit, in a transaction)."""
    if payloads:
        await _NOTIFY.run(conn, {"channel": channel, "payloads": list(payloads)})


@record
class EventNotice:
    """What a PostgreSQL notification tells of appended events: their ids, as runs of
    consecutive ids, and their kinds (None: not said, any kind).

    The events themselves stay in the table: a listener reads them only when one of its
    subscribers wants one of those kinds. Sending each event whole cost every manager a
    notification to receive and decode per event, whether or not anything subscribed (in a
    20,000-session `corral simulate`, 160,000 of them: 13 % of its throughput).
    """

    runs: tuple[tuple[int, int], ...]  # (first id, last id), ascending
    kinds: frozenset[str] | None

    @property
    def last_id(self) -> int:
        return self.runs[-1][1]

    @property
    def count(self) -> int:
        return sum(last - first + 1 for first, last in self.runs)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> EventNotice:
        """The notice whose JSON text (one of `event_notices`) decodes to `data`."""
        runs = tuple((int(first), int(last)) for first, last in data["ids"])
        if not runs or any(first > last for first, last in runs):
            raise ValueError("a notice names runs of ids, first to last")
        kinds = data.get("kinds")
        return cls(runs, None if kinds is None else frozenset(str(k) for k in kinds))


def event_notices(ids: Sequence[int], kinds: Collection[str]) -> list[str]:
    """JSON texts of notices for the events `ids` (ascending) of `kinds`, each of at most
    NOTIFY_LIMIT_BYTES: `{"kinds": [...], "ids": [[first, last], ...]}`."""
    if not ids:
        return []
    runs: list[list[int]] = []
    for event_id in ids:
        if runs and runs[-1][1] == event_id - 1:
            runs[-1][1] = event_id
        else:
            runs.append([event_id, event_id])
    kinds_text = json.dumps(sorted(kinds), separators=(",", ":"))
    if len(kinds_text) > _KINDS_LIMIT_BYTES:
        kinds_text = "null"
    head = '{"kinds":' + kinds_text + ',"ids":['
    room = NOTIFY_LIMIT_BYTES - len(head) - 2  # the closing "]}"
    texts: list[str] = []
    parts: list[str] = []
    size = 0
    for first, last in runs:
        part = f"[{first},{last}]"
        if parts and size + 1 + len(part) > room:
            texts.append(head + ",".join(parts) + "]}")
            parts, size = [], 0
        size += len(part) + (1 if parts else 0)
        parts.append(part)
    texts.append(head + ",".join(parts) + "]}")
    return texts


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
            "payloads": _each_once(payloads, dumps),
        }
        ids = sorted(await _INSERT.scalars(conn, params))
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
    appended = [
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
    if notify is not None and conn.dialect.name == "postgresql":
        if len(appended) <= WHOLE_EVENTS_MAX:
            texts = [notification(event) for event in appended]
        else:
            texts = event_notices(ids, {event[0] for event in events})
        await send_notifications(conn, notify, texts)
    return appended


def notification(event: Event) -> str:
    """The NOTIFY payload of one event: its JSON, or a notice of it when that is too large
    (an event without an id, never appended, cannot be sent so: ValueError)."""
    text = event.to_json()
    if len(text.encode()) <= NOTIFY_LIMIT_BYTES:
        return text
    if event.id is None:
        raise ValueError(
            f"event {event.kind!r} is too large for NOTIFY ({len(text.encode())} bytes) and has "
            "no id; append it with append_events and publish the returned event"
        )
    [notice] = event_notices([event.id], [event.kind])
    return notice


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
    newest: bool = False,
) -> list[Event]:
    """Up to `limit` events with ids above `after_id`, oldest first.

    `owner_id` keeps only that owner's events (what a non-admin may see); `entity_id` keeps
    only one entity's events. `newest`: the last `limit` of them (still oldest first), read
    backwards along the id index.
    """
    order = _c.id.desc() if newest else _c.id
    query = sa.select(events_table).where(_c.id > after_id).order_by(order).limit(limit)
    if owner_id is not None:
        query = query.where(_c.owner_id == owner_id)
    if entity_id is not None:
        query = query.where(_c.entity_id == entity_id)
    async with db.read() as conn:
        rows = (await conn.execute(query)).mappings().all()
    found = [_event(row) for row in rows]
    return found[::-1] if newest else found


def _read_runs(dialect: Dialect) -> sa.Select[Any]:
    """The events whose ids lie in any of the runs: PostgreSQL `firsts[i]`..`lasts[i]` (two
    arrays), SQLite `runs` (a JSON array of [first, last] pairs). Each run is a range of the
    key's index."""
    if dialect == "postgresql":
        bounds = (
            sa.func.unnest(
                sa.bindparam("firsts", type_=postgresql.ARRAY(sa.BigInteger())),
                sa.bindparam("lasts", type_=postgresql.ARRAY(sa.BigInteger())),
            )
            .table_valued("first", "last")
            .render_derived(name="runs")
        )
        first: sa.ColumnElement[Any] = bounds.c.first
        last: sa.ColumnElement[Any] = bounds.c.last
    else:
        bounds = sa.func.json_each(sa.bindparam("runs", type_=sa.String())).table_valued(
            "value", name="runs"
        )
        first = sa.func.json_extract(bounds.c.value, "$[0]")
        last = sa.func.json_extract(bounds.c.value, "$[1]")
    return sa.select(events_table).join(bounds, _c.id.between(first, last)).order_by(_c.id)


_READ_RUNS = DirectStatement(_read_runs)


async def read_noticed_events(db: Database, notices: Sequence[EventNotice]) -> dict[int, Event]:
    """The events the notices name that exist, by id (one statement)."""
    runs = [run for notice in notices for run in notice.runs]
    if not runs:
        return {}
    params: dict[str, Any]
    if db.dialect == "postgresql":
        params = {"firsts": [first for first, _ in runs], "lasts": [last for _, last in runs]}
    else:
        params = {"runs": json.dumps(runs)}
    async with db.read_statements() as conn:
        rows = await _READ_RUNS.rows(conn, params)
    return {row.id: _event(row._asdict()) for row in rows}


def _event(row: Mapping[Any, Any]) -> Event:
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
        events.append((SESSION_STATUS_CHANGED, SESSION_ENTITY, str(sid), owners.get(sid), found))
    return await _append(conn, events, now, notify)
