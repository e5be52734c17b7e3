"""The deployment and route handlers' history: repeats fold, moves never do."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from corral.store.serving_history import (
    HistoryEntry,
    read_route_history,
    record_route_history,
)

NOW = datetime(2030, 1, 1, tzinfo=UTC)


async def test_alternating_handlers_fold_their_repeats_until_the_route_moves(db: Any) -> None:
    """Two handlers keeping a HEALTHY route in turn add a row each, then only count; a move
    starts fresh rows."""
    route, deployment = uuid.uuid4(), uuid.uuid4()

    async def record(phase: str, to: str | None, at: int) -> None:
        entry = HistoryEntry(route, "healthy", to, "note", deployment)
        async with db.transaction() as conn:
            await record_route_history(
                conn, [entry], phase=phase, result="SUCCESS", now=NOW + timedelta(seconds=at)
            )

    for at in range(3):
        await record("HealthCheckRoute", None, at)
        await record("ServiceDiscoverySync", None, at)
    await record("ScalingDeployment", "terminating", 10)
    await record("ServiceDiscoverySync", None, 11)
    async with db.read() as conn:
        rows = await read_route_history(conn, deployment)
    assert [(r["phase"], r["to_status"], r["attempts"]) for r in rows] == [
        ("HealthCheckRoute", None, 3),
        ("ServiceDiscoverySync", None, 3),
        ("ScalingDeployment", "terminating", 1),
        ("ServiceDiscoverySync", None, 1),
    ]
    assert rows[0]["updated_at"] == NOW + timedelta(seconds=2)
