"""Scheduling history of sessions and kernels, with the merge rule of the spec README.

A new entry whose phase, result and target status equal those of the entity's newest row is
folded into that row (attempts + 1, timestamp and message refreshed) instead of adding a row, so
a session retried a thousand times in one phase costs one row, not a thousand.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store._sql import in_values
from corral.store.database import Dialect
from corral.store.tables import kernel_history, session_history


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One judged outcome for one session or kernel, as written to its history."""

    entity_id: uuid.UUID
    phase: str
    from_status: str | None
    to_status: str | None
    result: str
    error_code: str | None = None
    message: str = ""
    session_id: uuid.UUID | None = None  # kernels only: the kernel's session


async def record_session_history(
    conn: AsyncConnection, dialect: Dialect, entries: Sequence[HistoryEntry], now: datetime
) -> None:
    """Write session history entries with the merge rule, in the caller's transaction."""
    await _record(conn, dialect, session_history, session_history.c.session_id, entries, now)


async def record_kernel_history(
    conn: AsyncConnection, dialect: Dialect, entries: Sequence[HistoryEntry], now: datetime
) -> None:
    """Write kernel history entries with the merge rule, in the caller's transaction."""
    await _record(conn, dialect, kernel_history, kernel_history.c.kernel_id, entries, now)


async def _record(
    conn: AsyncConnection,
    dialect: Dialect,
    table: sa.Table,
    key: sa.Column[uuid.UUID],
    entries: Sequence[HistoryEntry],
    now: datetime,
) -> None:
    if not entries:
        return
    ids = {entry.entity_id for entry in entries}
    newest_ids = (
        sa.select(sa.func.max(table.c.id)).where(in_values(dialect, key, ids)).group_by(key)
    )
    rows = await conn.execute(
        sa.select(
            table.c.id, key, table.c.phase, table.c.result, table.c.to_status, table.c.attempts
        ).where(table.c.id.in_(newest_ids.scalar_subquery()))
    )
    newest = {row[1]: row for row in rows}

    merges: list[dict[str, object]] = []
    inserts: list[dict[str, object]] = []
    for entry in entries:
        last = newest.get(entry.entity_id)
        if (
            last is not None
            and last.phase == entry.phase
            and last.result == entry.result
            and last.to_status == entry.to_status
        ):
            merges.append(
                {
                    "row_id": last.id,
                    "attempts": last.attempts + 1,
                    "message": entry.message,
                    "error_code": entry.error_code,
                    "now": now,
                }
            )
            continue
        row: dict[str, object] = {
            key.name: entry.entity_id,
            "phase": entry.phase,
            "from_status": entry.from_status,
            "to_status": entry.to_status,
            "result": entry.result,
            "error_code": entry.error_code,
            "message": entry.message,
            "attempts": 1,
            "created_at": now,
            "updated_at": now,
        }
        if table is kernel_history:
            row["session_id"] = entry.session_id
        inserts.append(row)

    if merges:
        await conn.execute(
            table.update()
            .where(table.c.id == sa.bindparam("row_id"))
            .values(
                attempts=sa.bindparam("attempts"),
                message=sa.bindparam("message"),
                error_code=sa.bindparam("error_code"),
                updated_at=sa.bindparam("now"),
            ),
            merges,
        )
    if inserts:
        await conn.execute(table.insert(), inserts)
