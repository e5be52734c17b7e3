"""The first admin of a cluster, made on the database itself (`corral admin bootstrap`).

Like `airflow users create`: whoever can reach the database can make an admin, so the command
needs no running manager and no token. Once the cluster has an admin, more admins and tokens
are made through the API by an admin; a second bootstrap is refused unless forced (a lost
admin token), so it never mints an admin silently.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.types import ADMIN_ROLE, UserId
from corral.store.database import Database
from corral.store.tables import users
from corral.store.users import IssuedToken, insert_token

# Serialises bootstraps on PostgreSQL (SQLite's write lock already does): two at once on an
# empty cluster would otherwise each see no admin and each make one.
_BOOTSTRAP_LOCK_KEY = 0x636F7272616C0001  # "corral" and 1


class AdminExistsError(ValueError):
    """The cluster has an admin already; `admins` names them."""

    def __init__(self, admins: list[str]) -> None:
        super().__init__(
            f"the cluster has an admin already ({', '.join(admins)}); an admin makes users "
            "and tokens (`corral user create`, `corral token create`), or pass --force to "
            "mint another admin token anyway (e.g. the admin's token was lost)"
        )
        self.admins = admins


class NotAnAdminError(ValueError):
    """The user named exists and is not an admin (made one only when forced)."""


@record
class Bootstrapped:
    """What a bootstrap did: the admin, whether it was made now, and its new token."""

    user: str
    created: bool
    promoted: bool  # an existing user made an admin (forced)
    token: IssuedToken
    expires_at: datetime | None


async def bootstrap_admin(
    db: Database,
    name: str,
    now: datetime,
    *,
    expires_at: datetime | None,
    force: bool = False,
    token_name: str = "bootstrap",
) -> Bootstrapped:
    """Make `name` an admin (created if needed) and issue it a token, in one transaction.

    Refused (AdminExistsError) when the cluster has an admin already, and (NotAnAdminError)
    when `name` is a plain user, unless `force`.
    """
    async with db.transaction() as conn:
        if db.dialect == "postgresql":
            await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_BOOTSTRAP_LOCK_KEY)))
        admins = [
            admin
            for (admin,) in await conn.execute(
                sa.select(users.c.name).where(users.c.role == ADMIN_ROLE).order_by(users.c.name)
            )
        ]
        if admins and not force:
            raise AdminExistsError(admins)
        user_id, created, promoted = await _admin_named(conn, name, now, force=force)
        token = await insert_token(conn, user_id, token_name, now, expires_at)
    return Bootstrapped(name, created, promoted, token, expires_at)


async def _admin_named(
    conn: AsyncConnection, name: str, now: datetime, *, force: bool
) -> tuple[UserId, bool, bool]:
    """The admin `name`: (id, created now, promoted now)."""
    row = (
        await conn.execute(sa.select(users.c.id, users.c.role).where(users.c.name == name))
    ).first()
    if row is None:
        user_id = UserId(uuid.uuid4())
        await conn.execute(
            users.insert().values(id=user_id, name=name, role=ADMIN_ROLE, created_at=now)
        )
        return user_id, True, False
    user_id = UserId(row[0])
    if row[1] == ADMIN_ROLE:
        return user_id, False, False
    if not force:
        raise NotAnAdminError(
            f"user {name!r} exists and is not an admin; choose another --name, or pass "
            "--force to make them an admin"
        )
    await conn.execute(users.update().where(users.c.id == user_id).values(role=ADMIN_ROLE))
    return user_id, False, True
