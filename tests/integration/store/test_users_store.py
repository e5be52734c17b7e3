"""The first admin on the database, and the last admin kept: on SQLite and PostgreSQL, with
concurrent callers."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from corral.domain.types import ADMIN_ROLE, USER_ROLE, utcnow
from corral.store.admin_bootstrap import AdminExistsError, NotAnAdminError, bootstrap_admin
from corral.store.database import Database
from corral.store.tables import users
from corral.store.users import LastAdminError, create_user, principal_for, set_role


async def _admins(db: Database) -> list[str]:
    async with db.read() as conn:
        query = sa.select(users.c.name).where(users.c.role == ADMIN_ROLE).order_by(users.c.name)
        return list(await conn.scalars(query))


async def test_bootstrap_makes_the_first_admin_once(db: Database) -> None:
    """The first bootstrap makes the admin and a working token; a second is refused naming
    the admin; forced, it mints another token of the same admin."""
    now = utcnow()
    first = await bootstrap_admin(db, "admin", now, expires_at=None)
    assert (first.user, first.created, first.promoted) == ("admin", True, False)
    who = await principal_for(db, first.token.secret, now)
    assert who is not None and who.is_admin

    with pytest.raises(AdminExistsError, match=r"an admin already \(admin\)"):
        await bootstrap_admin(db, "ops", now, expires_at=None)
    assert await _admins(db) == ["admin"]

    forced = await bootstrap_admin(db, "admin", now, expires_at=None, force=True)
    assert (forced.created, forced.promoted) == (False, False)
    assert forced.token.secret != first.token.secret
    assert await principal_for(db, first.token.secret, now) is not None


async def test_bootstrap_makes_a_plain_user_an_admin_only_when_forced(db: Database) -> None:
    """Naming an existing plain user is refused; forced, they become an admin."""
    now = utcnow()
    await create_user(db, "carol", USER_ROLE, now)
    with pytest.raises(NotAnAdminError, match="'carol' exists and is not an admin"):
        await bootstrap_admin(db, "carol", now, expires_at=None)
    assert await _admins(db) == []
    done = await bootstrap_admin(db, "carol", now, expires_at=None, force=True)
    assert done.promoted and await _admins(db) == ["carol"]


async def test_concurrent_bootstraps_make_one_admin(db: Database) -> None:
    """Two bootstraps at once on an empty cluster: one admin, the other refused."""
    now = utcnow()
    outcomes = await asyncio.gather(
        bootstrap_admin(db, "one", now, expires_at=None),
        bootstrap_admin(db, "two", now, expires_at=None),
        return_exceptions=True,
    )
    refused = [o for o in outcomes if isinstance(o, AdminExistsError)]
    assert len(refused) == 1, outcomes
    assert len(await _admins(db)) == 1


async def test_two_admins_stepping_down_at_once_leave_one(db: Database) -> None:
    """Each demotes themself concurrently: one succeeds, the other is the last admin."""
    now = utcnow()
    for name in ("ann", "ben"):
        await create_user(db, name, ADMIN_ROLE, now)
    outcomes = await asyncio.gather(
        set_role(db, "ann", USER_ROLE, now),
        set_role(db, "ben", USER_ROLE, now),
        return_exceptions=True,
    )
    assert sum(isinstance(o, LastAdminError) for o in outcomes) == 1, outcomes
    assert len(await _admins(db)) == 1
