"""Status columns accept exactly their enum's values, on both backends (store.tables, 0013)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.domain.status import KernelStatus, SessionStatus
from corral.store.database import Database
from corral.store.tables import kernels, sessions
from tests.conftest import postgresql_only
from tests.integration._statements import estimated_rows
from tests.integration.store._factories import add_session_ids, add_user


@pytest.mark.parametrize(
    ("table", "statuses"), [(sessions, SessionStatus), (kernels, KernelStatus)]
)
async def test_every_status_of_the_enum_is_accepted_and_nothing_else(
    db: Database, table: sa.Table, statuses: type[SessionStatus] | type[KernelStatus]
) -> None:
    """Each value of the enum can be written (the domain or CHECK lists them all); a value
    outside it fails with IntegrityError and leaves the row as it was."""
    [session_id] = await add_session_ids(db, await add_user(db), 1)
    row = table.c.id if table is sessions else table.c.session_id
    for status in statuses:
        async with db.transaction() as conn:
            await conn.execute(table.update().where(row == session_id).values(status=status))
    with pytest.raises(sa.exc.IntegrityError):
        async with db.transaction() as conn:
            await conn.execute(table.update().where(row == session_id).values(status="BOGUS"))
    async with db.read() as conn:
        assert await conn.scalar(sa.select(table.c.status).where(row == session_id)) == (
            list(statuses)[-1].value
        )


@postgresql_only
async def test_postgresql_keeps_no_statistics_of_the_lifecycle_columns(db: Database) -> None:
    """Statistics of a status taken while every session was PENDING would tell the planner that
    none is SCHEDULED (migration 0014): ANALYZE gathers none for the lifecycle columns, and the
    planner expects a share of the rows for any status, never a single one."""
    await add_session_ids(db, await add_user(db), 2_000)
    async with db.autocommit() as conn:
        await conn.execute(sa.text("ANALYZE sessions, kernels"))
        gathered = (
            await conn.execute(
                sa.text(
                    "SELECT tablename || '.' || attname FROM pg_stats"
                    " WHERE tablename IN ('sessions', 'kernels')"
                )
            )
        ).scalars()
        expected = await estimated_rows(conn, "SELECT id FROM kernels WHERE status = 'SCHEDULED'")
    columns = set(gathered)
    assert {"sessions.id", "kernels.session_id"} <= columns  # ANALYZE ran
    lifecycle = {"sessions.status", "kernels.status", "kernels.agent_id", "kernels.desired_state"}
    assert not lifecycle & columns
    assert expected >= 5  # 0.5 % of 2,000 kernels, not 1
