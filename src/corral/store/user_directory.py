"""Users and their tokens as admins list them (never a secret or its hash)."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.types import UserId
from corral.store.database import Database
from corral.store.tables import api_tokens, users


@record
class UserRecord:
    """A user and when they were created."""

    id: UserId
    name: str
    role: str
    created_at: datetime


@record
class TokenRecord:
    """An API token's metadata: its secret was shown once, at creation, and is not kept."""

    id: uuid.UUID
    name: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None


async def list_user_records(
    db: Database, *, after_name: str | None = None, limit: int = 100
) -> list[UserRecord]:
    """Up to `limit` users with names after `after_name`, by name."""
    query = (
        sa.select(users.c.id, users.c.name, users.c.role, users.c.created_at)
        .order_by(users.c.name)
        .limit(limit)
    )
    if after_name is not None:
        query = query.where(users.c.name > after_name)
    async with db.read() as conn:
        return [UserRecord(UserId(r[0]), r[1], r[2], r[3]) for r in await conn.execute(query)]


async def get_user_record(db: Database, name: str) -> UserRecord | None:
    """The user with this name (None: no such user)."""
    query = sa.select(users.c.id, users.c.name, users.c.role, users.c.created_at).where(
        users.c.name == name
    )
    async with db.read() as conn:
        row = (await conn.execute(query)).first()
    return None if row is None else UserRecord(UserId(row[0]), row[1], row[2], row[3])


async def list_tokens(
    db: Database, user_id: UserId, *, after_id: uuid.UUID | None = None, limit: int = 100
) -> list[TokenRecord]:
    """Up to `limit` of the user's tokens with ids after `after_id`, by id."""
    c = api_tokens.c
    query = (
        sa.select(c.id, c.name, c.created_at, c.expires_at, c.last_used_at)
        .where(c.user_id == user_id)
        .order_by(c.id)
        .limit(limit)
    )
    if after_id is not None:
        query = query.where(c.id > after_id)
    async with db.read() as conn:
        return [TokenRecord(*row) for row in await conn.execute(query)]


async def unknown_user_names(db: Database, names: Collection[str]) -> list[str]:
    """Those of `names` no user has, sorted."""
    if not names:
        return []
    async with db.read() as conn:
        known = set(
            await conn.scalars(sa.select(users.c.name).where(users.c.name.in_(list(names))))
        )
    return sorted(set(names) - known)
