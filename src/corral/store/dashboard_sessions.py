"""Signed-in dashboards: a random secret per browser, stored hashed, bound to the user and the
API token that signed in.

The browser's cookie holds only the secret. A session ends at its `expires_at` (never after its
token's), at sign-out, and with its token or its user: the rows cascade from both, so a revoked
token's dashboards are refused at their next request on every manager.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.types import UserId
from corral.store.database import Database
from corral.store.tables import api_tokens, dashboard_sessions, users
from corral.store.users import Principal, hash_secret

SECRET_PREFIX = "dsh_"  # a dashboard session's secret, never an API token (`crl_`)


@record
class DashboardSession:
    """A dashboard session just opened: the secret (for the cookie) is only ever here."""

    secret: str
    principal: Principal
    expires_at: datetime


async def open_dashboard_session(
    db: Database, token: str, now: datetime, lifetime: timedelta
) -> DashboardSession | None:
    """A new session for the holder of API token `token`, ending after `lifetime` or with the
    token, whichever is first (None: the token is unknown or expired)."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    async with db.transaction() as conn:
        # Sessions that ended by time go as new ones come: the table holds the live ones.
        ended = dashboard_sessions.c.expires_at <= now
        await conn.execute(dashboard_sessions.delete().where(ended))
        row = (
            await conn.execute(
                sa.select(
                    api_tokens.c.id, api_tokens.c.expires_at, users.c.id, users.c.name, users.c.role
                )
                .select_from(api_tokens.join(users, users.c.id == api_tokens.c.user_id))
                .where(api_tokens.c.token_hash == hash_secret(token))
            )
        ).first()
        if row is None or (row[1] is not None and row[1] <= now):
            return None
        ends = now + lifetime if row[1] is None else min(now + lifetime, row[1])
        await conn.execute(
            dashboard_sessions.insert().values(
                secret_hash=hash_secret(secret),
                user_id=row[2],
                token_id=row[0],
                created_at=now,
                expires_at=ends,
            )
        )
    return DashboardSession(secret, Principal(UserId(row[2]), row[3], row[4]), ends)


_NOW = sa.bindparam("now", type_=dashboard_sessions.c.expires_at.type)
_HOLDER = (
    sa.select(users.c.id, users.c.name, users.c.role)
    .select_from(
        dashboard_sessions.join(api_tokens, api_tokens.c.id == dashboard_sessions.c.token_id).join(
            users, users.c.id == dashboard_sessions.c.user_id
        )
    )
    .where(
        dashboard_sessions.c.secret_hash == sa.bindparam("hash"),
        dashboard_sessions.c.expires_at > _NOW,
        # Bound to the token's user: a token moved to another user (never done) would not do.
        api_tokens.c.user_id == dashboard_sessions.c.user_id,
        sa.or_(
            api_tokens.c.expires_at.is_(None),
            api_tokens.c.expires_at > _NOW,
        ),
    )
)


async def dashboard_session_user(db: Database, secret: str, now: datetime) -> Principal | None:
    """The user of a live dashboard session (None: unknown, ended, or its token revoked or
    expired); the user's role as it is now."""
    async with db.read() as conn:
        row = (await conn.execute(_HOLDER, {"hash": hash_secret(secret), "now": now})).first()
    return None if row is None else Principal(UserId(row[0]), row[1], row[2])


async def close_dashboard_session(db: Database, secret: str) -> bool:
    """End a dashboard session (sign-out); False if there was none."""
    async with db.transaction() as conn:
        mine = dashboard_sessions.c.secret_hash == hash_secret(secret)
        done = await conn.execute(dashboard_sessions.delete().where(mine))
    return bool(done.rowcount)
