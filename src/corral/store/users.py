"""Users and their API tokens (stored as SHA-256 hashes; the secret is shown once)."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime

import sqlalchemy as sa

from corral.domain.events import Event
from corral.domain.record import record
from corral.domain.types import ADMIN_ROLE, UserId
from corral.store.database import Database
from corral.store.events import TOKEN_REVOKED, append_events
from corral.store.tables import api_tokens, users

ROLES = (ADMIN_ROLE, "user")
TOKEN_PREFIX = "crl_"  # makes a leaked corral token easy to recognise (and to scan for)


@record
class Principal:
    """Who is calling: a user and their role."""

    user_id: UserId
    name: str
    role: str

    @property
    def is_admin(self) -> bool:
        """Admins see and act on everything."""
        return self.role == ADMIN_ROLE


@record
class IssuedToken:
    """A token just created: the secret is only ever available here."""

    id: uuid.UUID
    secret: str


class UserExistsError(ValueError):
    """A user with this name exists already."""


def hash_secret(secret: str) -> str:
    """How token secrets (users' and agents') are stored: random, so an unsalted hash does."""
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_user(db: Database, name: str, role: str, now: datetime) -> UserId:
    """A new user; UserExistsError if the name is taken."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    user_id = UserId(uuid.uuid4())
    try:
        async with db.transaction() as conn:
            await conn.execute(
                users.insert().values(id=user_id, name=name, role=role, created_at=now)
            )
    except sa.exc.IntegrityError as exc:
        raise UserExistsError(f"a user named {name!r} exists already") from exc
    return user_id


async def issue_token(
    db: Database, user_id: UserId, name: str, now: datetime, expires_at: datetime | None = None
) -> IssuedToken:
    """A new API token for the user."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            api_tokens.insert().values(
                id=token_id,
                user_id=user_id,
                name=name,
                token_hash=hash_secret(secret),
                created_at=now,
                expires_at=expires_at,
            )
        )
    return IssuedToken(token_id, secret)


async def revoke_token(db: Database, token_id: uuid.UUID, now: datetime) -> Event | None:
    """Delete a token; the `token.revoked` event appended with it, or None if there was none.

    The event (no secret in it, only the token's id and its user as owner) is what tells every
    manager to forget the token at once (its `corral.infra.events.forget_on_events` watcher).
    """
    async with db.transaction() as conn:
        user_id = await conn.scalar(
            api_tokens.delete().where(api_tokens.c.id == token_id).returning(api_tokens.c.user_id)
        )
        if user_id is None:
            return None
        revoked = Event(
            kind=TOKEN_REVOKED,
            entity_type="token",
            entity_id=str(token_id),
            owner_id=user_id,
            created_at=now,
        )
        (appended,) = await append_events(conn, [revoked], now)
    return appended


async def principal_for(db: Database, secret: str, now: datetime) -> Principal | None:
    """The user a token secret belongs to (None: unknown or expired)."""
    async with db.read() as conn:
        row = (
            await conn.execute(
                sa.select(users.c.id, users.c.name, users.c.role, api_tokens.c.expires_at)
                .select_from(api_tokens.join(users, users.c.id == api_tokens.c.user_id))
                .where(api_tokens.c.token_hash == hash_secret(secret))
            )
        ).first()
    if row is None or (row[3] is not None and row[3] <= now):
        return None
    return Principal(UserId(row[0]), row[1], row[2])
