"""Scheduling history of sessions and kernels, with the merge rule of the spec README.

A new entry whose phase, result and target status equal those of the entity's newest row is
folded into that row (attempts + 1, timestamp refreshed) instead of adding a row, so a session
retried a thousand times in one phase costs one row, not a thousand.

Every status change of a session or kernel writes a history row (the store has no other status
writes), so an entity's newest row always ends at its current status. An entry that *moves*
the entity therefore never repeats the newest row, and only entries that keep the status
(NEED_RETRY, SKIPPED, a repeated success) are checked for a merge.

History is written set-based, inside the database: one UPDATE folds the entries that merge, one
INSERT ... SELECT adds the rest, reading the from-status straight from the entity rows. So these
functions must run before the status update they record, in the same transaction; no per-row
Python work happens, whatever the batch size.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.results import ResultNote
from corral.store._direct import DirectStatement
from corral.store._sql import IdBatch, in_constants, in_param, payload
from corral.store.database import Dialect
from corral.store.tables import kernel_history, kernels, session_history, sessions


async def record_session_history(
    conn: AsyncConnection,
    dialect: Dialect,
    session_ids: Collection[uuid.UUID] | IdBatch,
    *,
    phase: str,
    result: str,
    to_status: str | None,
    now: datetime,
    moving: bool,
    notes: Mapping[Any, ResultNote] | None = None,
    left: str | None = None,
) -> None:
    """Record one outcome for these sessions; `to_status` None means "stays where it is".

    `moving` says every one of them is changing status now (so none can merge). `left`: the
    status they all leave, where their rows do not hold it (a later move of a chain written
    before the rows are); by default it is read from the rows.
    """
    if not session_ids:
        return
    merged: set[uuid.UUID] = set()
    if not moving:
        merged = set(
            await _session_merge(stays=to_status is None).scalars(
                conn,
                {
                    "ids": payload(dialect, session_ids),
                    "phase": phase,
                    "result": result,
                    "to": to_status,
                    "now": now,
                },
            )
        )
    fresh = session_ids if not merged else [sid for sid in session_ids if sid not in merged]
    if fresh:
        await _session_insert(stays=to_status is None, left=left is not None).run(
            conn,
            {
                "ids": payload(dialect, fresh),
                "phase": phase,
                "result": result,
                "to": to_status,
                "now": now,
                "left": left,
            },
        )
    if notes:
        await _write_notes(conn, dialect, session_ids, notes)


async def record_kernel_history(
    conn: AsyncConnection,
    dialect: Dialect,
    session_ids: Collection[uuid.UUID] | IdBatch,
    from_statuses: Collection[str],
    *,
    phase: str,
    result: str,
    to_status: str,
    now: datetime,
    message: str = "",
    message_names_agent: bool = False,
    recorded_from: str | None = None,
) -> None:
    """Record a move to `to_status` for these sessions' kernels that are in `from_statuses`.

    Call it before the kernels move; or after, passing the status they left as `recorded_from`
    (and the status they are in now as `from_statuses`). With `message_names_agent`, each
    kernel's agent id follows `message` ("placed on " + agent). Kernels only get history when
    they move, so these entries never merge (see the module docstring).
    """
    if not session_ids:
        return
    statement = _kernel_insert(
        tuple(sorted(from_statuses)),
        recorded_from=recorded_from is not None,
        message_names_agent=message_names_agent,
    )
    await statement.run(
        conn,
        {
            "ids": payload(dialect, session_ids),
            "phase": phase,
            "result": result,
            "to": to_status,
            "message": message,
            "now": now,
            "left": recorded_from,
        },
    )


@functools.cache
def _session_insert(*, stays: bool, left: bool) -> DirectStatement:
    """The INSERT ... SELECT of `record_session_history`, built once per shape.

    Parameters: ids, phase, result, to (unless the sessions stay where they are), now, and
    `left` (the status left) where the rows do not hold it.
    """

    def build(dialect: Dialect) -> sa.Insert:
        to_expr = sessions.c.status if stays else sa.bindparam("to", type_=sa.String())
        from_expr = sa.bindparam("left", type_=sa.String()) if left else sessions.c.status
        return session_history.insert().from_select(
            [*_COLUMNS, "session_id"],
            sa.select(
                *_new_row(
                    sa.bindparam("phase", type_=sa.String()),
                    from_expr,
                    to_expr,
                    sa.bindparam("result", type_=sa.String()),
                    sa.bindparam("now", type_=session_history.c.created_at.type),
                ),
                sessions.c.id,
            ).where(in_param(dialect, sessions.c.id, "ids")),
        )

    return DirectStatement(build)


@functools.cache
def _session_merge(*, stays: bool) -> DirectStatement:
    """Fold the entries that repeat each session's newest row; returns the sessions folded.

    Parameters: ids, phase, result, to (unless the sessions stay where they are), now.
    """

    def build(dialect: Dialect) -> sa.Update:
        table, key = session_history, session_history.c.session_id
        newest = (
            sa.select(sa.func.max(table.c.id))
            .where(in_param(dialect, key, "ids"))
            .group_by(key)
            .scalar_subquery()
        )
        to_expr: sa.ColumnElement[Any] = (
            sa.select(sessions.c.status).where(sessions.c.id == key).scalar_subquery()
            if stays
            else sa.bindparam("to", type_=sa.String())
        )
        return (
            table.update()
            .where(
                table.c.id.in_(newest),
                table.c.phase == sa.bindparam("phase", type_=sa.String()),
                table.c.result == sa.bindparam("result", type_=sa.String()),
                table.c.to_status == to_expr,
            )
            .values(
                attempts=table.c.attempts + 1,
                updated_at=sa.bindparam("now", type_=table.c.updated_at.type),
            )
            .returning(key)
        )

    return DirectStatement(build)


@functools.cache
def _kernel_insert(
    from_statuses: tuple[str, ...], *, recorded_from: bool, message_names_agent: bool
) -> DirectStatement:
    """`record_kernel_history`'s INSERT ... SELECT, built once per shape.

    Parameters: ids (sessions), phase, result, to, message, now, and `left` (the status left)
    when the kernels have moved already.
    """

    def build(dialect: Dialect) -> sa.Insert:
        message: sa.ColumnElement[str] = sa.bindparam("message", type_=sa.Text())
        if message_names_agent:
            message = message + kernels.c.agent_id
        left = sa.bindparam("left", type_=sa.String()) if recorded_from else kernels.c.status
        return kernel_history.insert().from_select(
            [*_COLUMNS, "kernel_id", "session_id"],
            sa.select(
                *_new_row(
                    sa.bindparam("phase", type_=sa.String()),
                    left,
                    sa.bindparam("to", type_=sa.String()),
                    sa.bindparam("result", type_=sa.String()),
                    sa.bindparam("now", type_=kernel_history.c.created_at.type),
                    message,
                ),
                kernels.c.id,
                kernels.c.session_id,
            ).where(
                in_param(dialect, kernels.c.session_id, "ids"),
                in_constants(kernels.c.status, from_statuses),
            ),
        )

    return DirectStatement(build)


_COLUMNS = [
    "phase",
    "from_status",
    "to_status",
    "result",
    "message",
    "attempts",
    "created_at",
    "updated_at",
]


def _new_row(
    phase: sa.ColumnElement[Any],
    from_expr: sa.ColumnElement[Any],
    to_expr: sa.ColumnElement[Any],
    result: sa.ColumnElement[Any],
    stamp: sa.ColumnElement[Any],
    message: sa.ColumnElement[Any] | None = None,
) -> list[sa.ColumnElement[Any]]:
    """A new history row's values, in `_COLUMNS` order (created and updated both `stamp`)."""
    return [
        phase,
        from_expr,
        to_expr,
        result,
        message if message is not None else sa.literal(""),
        sa.literal(1),
        stamp,
        stamp,
    ]


# Entities sharing one note from this many on are noted with one set-based statement per note
# (a scheduling pass notes thousands of waiting sessions "no agent has room"); fewer, and notes
# of their own, go in one executemany.
SHARED_NOTE_MIN = 8


def by_note(
    ids: Collection[Any], notes: Mapping[Any, ResultNote]
) -> tuple[dict[ResultNote, list[Any]], list[Any]]:
    """The noted `ids`: those sharing a note with at least SHARED_NOTE_MIN others, grouped by
    it, and the rest."""
    grouped: dict[ResultNote, list[Any]] = {}
    for k in ids:
        note = notes.get(k)
        if note is not None:
            grouped.setdefault(note, []).append(k)
    shared = {note: keys for note, keys in grouped.items() if len(keys) >= SHARED_NOTE_MIN}
    rest = [k for note, keys in grouped.items() if len(keys) < SHARED_NOTE_MIN for k in keys]
    return shared, rest


async def _write_notes(
    conn: AsyncConnection,
    dialect: Dialect,
    ids: Collection[uuid.UUID] | IdBatch,
    notes: Mapping[Any, ResultNote],
) -> None:
    """Put each noted session's code and message on its newest history row (unless there)."""
    shared, rest = by_note(ids.values if isinstance(ids, IdBatch) else ids, notes)
    for note, keys in shared.items():
        await _SHARED_NOTE.run(
            conn, {"ids": payload(dialect, keys), "code": note.code or None, "msg": note.message}
        )
    if rest:
        await _OWN_NOTE.run_many(
            conn, [{"k": k, "code": notes[k].code or None, "msg": notes[k].message} for k in rest]
        )


def _noted(newest: sa.ColumnElement[Any]) -> sa.Update:
    """The note put on the session history rows `newest` selects."""
    table = session_history
    code = sa.bindparam("code", type_=sa.String())
    message = sa.bindparam("msg", type_=sa.Text())
    return (
        table.update()
        .where(
            table.c.id.in_(newest),
            # A row folded again with the same note is left as it is: no write at all.
            sa.or_(table.c.error_code.is_distinct_from(code), table.c.message != message),
        )
        .values(error_code=code, message=message)
    )


_SHARED_NOTE = DirectStatement(
    lambda dialect: _noted(
        sa.select(sa.func.max(session_history.c.id))
        .where(in_param(dialect, session_history.c.session_id, "ids"))
        .group_by(session_history.c.session_id)
        .scalar_subquery(),
    )
)
_OWN_NOTE = DirectStatement(
    lambda _dialect: _noted(
        sa.select(sa.func.max(session_history.c.id))
        .where(session_history.c.session_id == sa.bindparam("k", type_=sessions.c.id.type))
        .scalar_subquery(),
    )
)
