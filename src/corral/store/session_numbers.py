"""Session numbers: the short, cluster-wide, increasing integers users type instead of ids.

Numbers are taken for a whole batch of new sessions in one statement, inside the transaction
that writes them. On PostgreSQL they come from a sequence: several managers take numbers at
once without waiting on each other, and a number taken by a transaction that rolls back is
skipped, never given again. On SQLite every write transaction holds the database's one write
lock from its BEGIN IMMEDIATE, so a counter row advanced in it cannot be advanced by anyone
else before the commit (and a rollback takes the numbers back unused).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store._direct import DirectStatement
from corral.store.tables import counters

SESSION_NUMBERS = "session_numbers"  # the PostgreSQL sequence, and SQLite's row in `counters`

_COUNT = sa.bindparam("count", type_=sa.Integer())

_NEXT_ON_POSTGRESQL = DirectStatement(
    lambda _dialect: sa.select(sa.func.nextval(SESSION_NUMBERS)).select_from(
        sa.func.generate_series(1, _COUNT)
    )
)
_ADVANCE_ON_SQLITE = DirectStatement(
    lambda _dialect: (
        counters.update()
        .where(counters.c.name == SESSION_NUMBERS)
        .values(value=counters.c.value + _COUNT)
        .returning(counters.c.value)
    )
)


async def take_session_numbers(conn: AsyncConnection, count: int) -> list[int]:
    """`count` new session numbers, ascending, in the caller's (write) transaction."""
    if count <= 0:
        return []
    if conn.dialect.name == "postgresql":
        # Concurrent batches may interleave, but each batch's numbers ascend with its sessions.
        return sorted(await _NEXT_ON_POSTGRESQL.scalars(conn, {"count": count}))
    (last,) = await _ADVANCE_ON_SQLITE.scalars(conn, {"count": count})
    return list(range(last - count + 1, last + 1))
