"""Users and their API tokens (stored as SHA-256 hashes; the secret is shown once)."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import Event
from corral.domain.record import record
from corral.domain.status import SESSION_TERMINAL
from corral.domain.types import ADMIN_ROLE, USER_ROLE, UserId
from corral.store.database import Database
from corral.store.events import TOKEN_REVOKED, USER_REMOVED, USER_ROLE_CHANGED, append_events
from corral.store.group_options import forget_group_options
from corral.store.resource_group_store import drop_allowed_user
from corral.store.tables import api_tokens, sessions, users

ROLES = (ADMIN_ROLE, USER_ROLE)
USER_ENTITY = "user"
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


@record
class TokenHolder:
    """Whose a token secret is, and until when it is good (None: for ever)."""

    principal: Principal
    expires_at: datetime | None


class UserExistsError(ValueError):
    """A user with this name exists already."""


class UnknownUserError(LookupError):
    """No user has this name."""


class LastAdminError(ValueError):
    """The change would leave the cluster without an admin."""


class UserHasSessionsError(ValueError):
    """The user owns sessions, which keep their owner: `active` of them have not ended."""

    def __init__(self, name: str, total: int, active: int) -> None:
        ended = total - active
        super().__init__(
            f"user {name!r} owns {total} session(s) ({active} not ended, {ended} ended); a "
            "user is removed once they own none: terminate the active ones, then remove "
            "the ended ones (`corral session rm`) or let retention delete them"
        )
        self.total = total
        self.active = active


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
    async with db.transaction() as conn:
        return await insert_token(conn, user_id, name, now, expires_at)


async def insert_token(
    conn: AsyncConnection,
    user_id: UserId,
    name: str,
    now: datetime,
    expires_at: datetime | None = None,
) -> IssuedToken:
    """`issue_token` in the caller's transaction."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = uuid.uuid4()
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


async def revoke_token(
    db: Database, token_id: uuid.UUID, now: datetime, *, owner: UserId | None = None
) -> Event | None:
    """Delete a token (of `owner`, when given); the `token.revoked` event appended with it, or
    None if there was none.

    The event (no secret in it, only the token's id and its user as owner) is what tells every
    manager to forget the token at once (its `corral.infra.events.forget_on_events` watcher).
    """
    match = api_tokens.c.id == token_id
    if owner is not None:
        match = sa.and_(match, api_tokens.c.user_id == owner)
    async with db.transaction() as conn:
        user_id = await conn.scalar(
            api_tokens.delete().where(match).returning(api_tokens.c.user_id)
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


async def token_holder(db: Database, secret: str) -> TokenHolder | None:
    """The user a token secret belongs to and when it expires (None: no such token)."""
    async with db.read() as conn:
        row = (
            await conn.execute(
                sa.select(users.c.id, users.c.name, users.c.role, api_tokens.c.expires_at)
                .select_from(api_tokens.join(users, users.c.id == api_tokens.c.user_id))
                .where(api_tokens.c.token_hash == hash_secret(secret))
            )
        ).first()
    if row is None:
        return None
    return TokenHolder(Principal(UserId(row[0]), row[1], row[2]), row[3])


async def principal_for(db: Database, secret: str, now: datetime) -> Principal | None:
    """The user a token secret belongs to (None: unknown or expired at `now`)."""
    holder = await token_holder(db, secret)
    if holder is None or (holder.expires_at is not None and holder.expires_at <= now):
        return None
    return holder.principal


async def read_principal(conn: AsyncConnection, user_id: UserId) -> Principal | None:
    """The user with this id, in the caller's transaction (None: no such user)."""
    row = (
        await conn.execute(sa.select(users.c.name, users.c.role).where(users.c.id == user_id))
    ).first()
    return None if row is None else Principal(user_id, row[0], row[1])


async def set_role(db: Database, name: str, role: str, now: datetime) -> Event | None:
    """Give the user `role`; the `user.role_changed` event, or None if they had it already.

    UnknownUserError for no such user, LastAdminError when the last admin would become a user.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    async with db.transaction() as conn:
        admins = await _lock_admins(conn)
        user = await _lock_user(conn, name)
        if user.role == role:
            return None
        if admins == [name]:
            raise _last_admin(name, "stop being an admin")
        await conn.execute(users.update().where(users.c.id == user.user_id).values(role=role))
        (event,) = await append_events(
            conn,
            [_user_event(USER_ROLE_CHANGED, user, now, {"from": user.role, "to": role})],
            now,
        )
    return event


async def delete_user(db: Database, name: str, now: datetime) -> list[Event]:
    """Remove a user who owns no session, with their tokens and uploads, and take them off
    every group's `allowed_users`; the events: `user.removed`, then the groups changed.

    UnknownUserError, LastAdminError (the last admin), UserHasSessionsError (sessions keep
    their owner: they must be gone first).
    """
    async with db.transaction() as conn:
        admins = await _lock_admins(conn)
        user = await _lock_user(conn, name)
        if admins == [name]:
            raise _last_admin(name, "be removed")
        terminal = [status.value for status in SESSION_TERMINAL]
        total, active = (
            await conn.execute(
                sa.select(
                    sa.func.count(),
                    sa.func.count().filter(sessions.c.status.not_in(terminal)),
                ).where(sessions.c.owner_id == user.user_id)
            )
        ).one()
        if total:
            raise UserHasSessionsError(name, int(total), int(active))
        await conn.execute(users.delete().where(users.c.id == user.user_id))
        events = await append_events(conn, [_user_event(USER_REMOVED, user, now, {})], now)
        groups = await drop_allowed_user(conn, name, now)
    if groups:
        forget_group_options(db)
    return events + groups


async def _lock_user(conn: AsyncConnection, name: str) -> Principal:
    row = (
        await conn.execute(
            sa.select(users.c.id, users.c.role).where(users.c.name == name).with_for_update()
        )
    ).first()
    if row is None:
        raise UnknownUserError(f"user {name!r} does not exist; `corral user ls` lists the users")
    return Principal(UserId(row[0]), name, row[1])


async def _lock_admins(conn: AsyncConnection) -> list[str]:
    """The admins' names, their rows locked in id order: two admins demoting or removing each
    other at once are so taken one after the other, and the second sees the first's change."""
    query = (
        sa.select(users.c.name)
        .where(users.c.role == ADMIN_ROLE)
        .order_by(users.c.id)
        .with_for_update()
    )
    return [name for (name,) in await conn.execute(query)]


def _last_admin(name: str, what: str) -> LastAdminError:
    return LastAdminError(
        f"{name!r} is the only admin and cannot {what}; make another admin first "
        "(`corral user set NAME --role admin`)"
    )


def _user_event(kind: str, user: Principal, now: datetime, payload: dict[str, str]) -> Event:
    return Event(
        kind=kind,
        entity_type=USER_ENTITY,
        entity_id=user.name,
        owner_id=user.user_id,
        payload={"name": user.name, **payload},
        created_at=now,
    )
