"""Status columns accept exactly their enum's values, on both backends (store.tables, 0013)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.domain.status import KernelStatus, SessionStatus
from corral.store.database import Database
from corral.store.tables import kernels, sessions
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
