"""Recording the SQL statements a block of test code sends; the planner's estimate of one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from corral.store.database import Database


@contextmanager
def recorded_statements(db: Database) -> Iterator[list[str]]:
    """The SQL statements sent through `db` inside the block (as `before_cursor_execute` sees
    them: SQLAlchemy's own and direct statements alike)."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = db.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


async def estimated_rows(conn: Any, statement: str) -> float:
    """PostgreSQL: the rows the planner expects `statement` (SQL text) to return."""
    plan = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}")).scalar()
    explained = json.loads(plan) if isinstance(plan, str) else plan  # asyncpg decodes JSON
    return float(explained[0]["Plan"]["Plan Rows"])
