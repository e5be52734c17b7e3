"""Session numbers: increasing in creation order, unique under concurrent creates, never reused."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from corral.domain.session import NewSession
from corral.domain.types import SessionId, UserId
from corral.store.database import Database
from corral.store.migrate import upgrade
from corral.store.sessions import insert_sessions
from corral.store.tables import sessions, users
from tests.integration.store._factories import NOW, add_session_ids, add_user


def _new(owner: UserId) -> NewSession:
    return NewSession(
        id=SessionId(uuid.uuid4()),
        owner_id=owner,
        type="BATCH",
        resource_group="default",
        cluster_mode="single-node",
        cluster_size=1,
        spec={"image": "python", "command": ["true"]},
        kernel_slots={"cpu": 1000},
    )


async def _numbers(db: Database, ids: list[SessionId]) -> list[int]:
    async with db.read() as conn:
        rows = await conn.execute(sa.select(sessions.c.id, sessions.c.number))
        found = {sid: number for sid, number in rows}
    return [found[sid] for sid in ids]


async def test_numbers_start_at_one_and_follow_creation_order(db: Database) -> None:
    """A batch is numbered in its order, and the next batch goes on from there."""
    owner = await add_user(db)
    first = await add_session_ids(db, owner, 3)
    second = await add_session_ids(db, owner, 2)
    assert await _numbers(db, first + second) == [1, 2, 3, 4, 5]


async def test_concurrent_creates_from_several_managers_never_share_a_number(
    db: Database,
) -> None:
    """Four database handles (as four managers) creating at once: every number is unique."""
    owner = await add_user(db)
    handles = [Database.open(db.url, pool_size=3) for _ in range(4)]
    try:
        made: list[list[SessionId]] = await asyncio.gather(
            *(add_session_ids(handle, owner, 5) for handle in handles for _ in range(5))
        )
    finally:
        for handle in handles:
            await handle.close()
    ids = [sid for batch in made for sid in batch]
    numbers = await _numbers(db, ids)
    assert len(set(numbers)) == len(ids) == 100
    for batch in made:  # each batch ascends with its sessions
        in_batch = await _numbers(db, batch)
        assert in_batch == sorted(in_batch)


async def test_a_removed_or_rolled_back_number_is_not_given_again(db: Database) -> None:
    """Removing the newest session, or a create that rolls back, frees no number for reuse."""
    owner = await add_user(db)
    (first,) = await add_session_ids(db, owner, 1)
    async with db.transaction() as conn:
        await conn.execute(sessions.delete().where(sessions.c.id == first))
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await insert_sessions(conn, [_new(owner)], NOW)
            raise RuntimeError("the create fails after taking its number")
    (later,) = await add_session_ids(db, owner, 1)
    (number,) = await _numbers(db, [later])
    assert number > 1


async def test_the_migration_numbers_existing_sessions_by_creation_time(empty_db: Database) -> None:
    """Sessions made before numbers existed get 1, 2, ... oldest first; new ones go on."""
    await upgrade(empty_db, "0015")  # the revision before numbers
    owner = uuid.uuid4()
    ids = [uuid.uuid4() for _ in range(3)]
    async with empty_db.transaction() as conn:
        await conn.execute(users.insert().values(id=owner, name="ada", role="user", created_at=NOW))
        for age, sid in zip((2, 0, 1), ids, strict=True):  # created out of id order
            await conn.execute(
                sa.text(
                    "INSERT INTO sessions (id, owner_id, type, resource_group, cluster_mode,"
                    " cluster_size, spec, status, status_changed_at, created_at, failed_agents)"
                    " VALUES (:id, :owner, 'BATCH', 'default', 'single-node', 1, '{}',"
                    " 'PENDING', :at, :at, '[]')"
                ).bindparams(
                    sa.bindparam("id", type_=sa.Uuid()),
                    sa.bindparam("owner", type_=sa.Uuid()),
                    sa.bindparam("at", type_=sessions.c.created_at.type),
                ),
                {"id": sid, "owner": owner, "at": NOW + timedelta(seconds=age)},
            )
    await upgrade(empty_db)
    assert await _numbers(empty_db, [SessionId(s) for s in ids]) == [3, 1, 2]
    (new,) = await add_session_ids(empty_db, UserId(owner), 1)
    assert await _numbers(empty_db, [new]) == [4]
