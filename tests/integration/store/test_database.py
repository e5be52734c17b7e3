"""Database's connection kinds beyond read and write transactions."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from corral.store.database import Database
from tests.integration.store._factories import NOW

_USER = sa.text("INSERT INTO users (id, name, role, created_at) VALUES (:id, :name, 'user', :at)")


async def test_autocommit_commits_each_statement_at_once(db: Database) -> None:
    """A statement on an autocommit connection is visible elsewhere before the block ends;
    SQLite has no such connection (its writers go through transaction())."""
    if db.dialect == "sqlite":
        with pytest.raises(ValueError, match="PostgreSQL"):
            async with db.autocommit():
                pass
        return
    user_id = uuid.uuid4()
    async with db.autocommit() as conn:
        await conn.execute(_USER, {"id": user_id, "name": "auto", "at": NOW})
        async with db.read() as other:
            seen = await other.scalar(
                sa.text("SELECT name FROM users WHERE id = :id"), {"id": user_id}
            )
        assert seen == "auto"
