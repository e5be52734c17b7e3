"""History of the deployment and route handlers (spec document 1's comparison table): a row
per outcome of a handler on a deployment (SUCCESS / FAILURE) or route (SUCCESS / FAILURE /
STALE), with the status it left and the one it reached.

Repeats are folded as in the sessions' history (`store.history`): an outcome that keeps the
status is folded into the entity's newest row of the same phase (attempts + 1, timestamp
refreshed) when that row also kept the status with the same result and the entity has not
moved since. The newest row of the same phase, not the newest row: several handlers look at a
HEALTHY route in turn (HealthCheckRoute, ServiceDiscoverySync), and a route probed healthy
every ten seconds for a month must cost a row per handler, not half a million.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store.tables import deployment_history, route_history

# The length a history message is cut to (notes are short; a probe's answer may not be).
MAX_MESSAGE = 1000


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One handler outcome on one deployment or route; `to_status` None: it stays."""

    entity_id: uuid.UUID
    from_status: str
    to_status: str | None
    message: str = ""
    deployment_id: uuid.UUID | None = None  # a route's deployment (route history only)


async def record_deployment_history(
    conn: AsyncConnection,
    entries: Sequence[HistoryEntry],
    *,
    phase: str,
    result: str,
    now: datetime,
) -> None:
    """Record `result` of `phase` for these deployments."""
    await _record(conn, deployment_history, "deployment_id", entries, phase, result, now)


async def record_route_history(
    conn: AsyncConnection,
    entries: Sequence[HistoryEntry],
    *,
    phase: str,
    result: str,
    now: datetime,
) -> None:
    """Record `result` of `phase` for these routes (each entry names its deployment)."""
    await _record(conn, route_history, "route_id", entries, phase, result, now)


async def _record(
    conn: AsyncConnection,
    table: sa.Table,
    key: str,
    entries: Sequence[HistoryEntry],
    phase: str,
    result: str,
    now: datetime,
) -> None:
    if not entries:
        return
    staying = [e for e in entries if e.to_status is None]
    merged: set[uuid.UUID] = set()
    if staying:
        column = table.c[key]
        newest_of_phase = (
            sa.select(sa.func.max(table.c.id))
            .where(column.in_([e.entity_id for e in staying]), table.c.phase == phase)
            .group_by(column)
        )
        later = table.alias("later")
        moved_since = sa.exists().where(
            later.c[key] == column, later.c.id > table.c.id, later.c.to_status.is_not(None)
        )
        folded = await conn.execute(
            table.update()
            .where(
                table.c.id.in_(newest_of_phase.scalar_subquery()),
                table.c.result == result,
                table.c.to_status.is_(None),
                ~moved_since,
            )
            .values(attempts=table.c.attempts + 1, updated_at=now)
            .returning(column)
        )
        merged = {row[0] for row in folded}
    rows: list[dict[str, Any]] = []
    for entry in entries:
        if entry.entity_id in merged:
            continue
        row = {
            key: entry.entity_id,
            "phase": phase,
            "from_status": entry.from_status,
            "to_status": entry.to_status,
            "result": result,
            "message": entry.message[:MAX_MESSAGE],
            "attempts": 1,
            "created_at": now,
            "updated_at": now,
        }
        if table is route_history:
            row["deployment_id"] = entry.deployment_id
        rows.append(row)
    if rows:
        await conn.execute(table.insert(), rows)


async def read_deployment_history(
    conn: AsyncConnection, deployment_id: uuid.UUID
) -> list[dict[str, Any]]:
    """A deployment's history, oldest first."""
    return await _read(conn, deployment_history, deployment_id)


async def read_route_history(
    conn: AsyncConnection, deployment_id: uuid.UUID
) -> list[dict[str, Any]]:
    """The history of a deployment's routes, oldest first."""
    return await _read(conn, route_history, deployment_id)


async def _read(
    conn: AsyncConnection, table: sa.Table, deployment_id: uuid.UUID
) -> list[dict[str, Any]]:
    rows = await conn.execute(
        sa.select(table).where(table.c.deployment_id == deployment_id).order_by(table.c.id)
    )
    return [dict(r._mapping) for r in rows]


async def delete_serving_history(
    conn: AsyncConnection, deployment_ids: Sequence[uuid.UUID]
) -> None:
    """Delete the history of these deployments and their routes (they are being removed)."""
    if not deployment_ids:
        return
    for table in (deployment_history, route_history):
        await conn.execute(table.delete().where(table.c.deployment_id.in_(list(deployment_ids))))
