"""Direct statements: the same rows, rules and errors as SQLAlchemy's own execution."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from corral.store._direct import DirectStatement, insert_columns
from corral.store._sql import in_param, payload
from corral.store.database import Database
from corral.store.tables import events, users
from tests.integration._statements import recorded_statements
from tests.integration.store._factories import NOW, add_user

_ADD_USER = DirectStatement(
    lambda _dialect: users.insert().values(
        id=sa.bindparam("id"), name=sa.bindparam("name"), role="user", created_at=sa.bindparam("at")
    )
)
_USERS = DirectStatement(
    lambda dialect: (
        sa.select(users.c.id, users.c.name, users.c.created_at)
        .where(in_param(dialect, users.c.id, "ids"))
        .order_by(users.c.name)
    )
)
_RENAME = DirectStatement(
    lambda dialect: (
        users.update()
        .where(in_param(dialect, users.c.id, "ids"))
        .values(name=users.c.name + "-renamed")
    )
)
_ADD_EVENT = DirectStatement(
    lambda _dialect: (
        events.insert()
        .values(
            kind="test.kind",
            entity_type="test",
            entity_id=sa.bindparam("entity"),
            payload=sa.bindparam("payload"),
            created_at=sa.bindparam("at"),
        )
        .returning(events.c.id, events.c.payload, events.c.created_at)
    )
)


async def test_rows_come_back_as_sqlalchemy_converts_them(db: Database) -> None:
    """UUIDs, aware datetimes and JSON read directly equal what SQLAlchemy's execute returns."""
    first, second = await add_user(db), await add_user(db)
    async with db.transaction() as conn:
        [added] = await _ADD_EVENT.rows(
            conn, {"entity": "e1", "payload": {"a": [1, "x"]}, "at": NOW}
        )
    assert added.payload == {"a": [1, "x"]}
    assert added.created_at == NOW
    async with db.read() as conn:
        direct = await _USERS.rows(conn, {"ids": payload(db.dialect, [first, second])})
        query = sa.select(users.c.id, users.c.name, users.c.created_at).where(
            users.c.id.in_([first, second])
        )
        expected = (await conn.execute(query.order_by(users.c.name))).all()
        stored = (await conn.execute(sa.select(events).where(events.c.id == added.id))).one()
    assert [tuple(row) for row in direct] == [tuple(row) for row in expected]
    assert {row.id for row in direct} == {first, second}
    assert all(isinstance(row.id, uuid.UUID) for row in direct)
    assert direct[0].created_at.utcoffset() == timedelta(0)
    assert stored.payload == {"a": [1, "x"]}


async def test_scalars_and_rowcount(db: Database) -> None:
    """`scalars` gives the first column, converted; `run` the number of rows changed."""
    ids = [await add_user(db) for _ in range(3)]
    async with db.transaction() as conn:
        changed = await _RENAME.run(conn, {"ids": payload(db.dialect, ids[:2])})
        found = await _USERS.scalars(conn, {"ids": payload(db.dialect, ids)})
    assert changed == 2
    assert sorted(found) == sorted(ids)
    async with db.read() as conn:
        names = set((await conn.execute(sa.select(users.c.name))).scalars())
    assert sum(name.endswith("-renamed") for name in names) == 2


async def test_a_direct_statement_belongs_to_the_callers_transaction(db: Database) -> None:
    """A direct write as a transaction's first statement is rolled back with the transaction
    (PostgreSQL's adapter begins its transaction lazily; the direct path must begin it too)."""
    user_id = uuid.uuid4()
    with pytest.raises(RuntimeError, match="abandon"):
        async with db.transaction() as conn:
            await _ADD_USER.run(conn, {"id": user_id, "name": "ghost", "at": NOW})
            raise RuntimeError("abandon")
    async with db.read() as conn:
        assert await _USERS.rows(conn, {"ids": payload(db.dialect, [user_id])}) == []


async def test_a_read_keeps_its_snapshot(db: Database) -> None:
    """A direct read that starts a read transaction gets its snapshot: a commit in between is
    not seen by the transaction's later reads (REPEATABLE READ on PostgreSQL, WAL on SQLite)."""
    first = await add_user(db)
    async with db.read() as conn:
        before = await _USERS.scalars(conn, {"ids": payload(db.dialect, [first])})
        later = await add_user(db)
        seen = await _USERS.scalars(conn, {"ids": payload(db.dialect, [first, later])})
    assert before == [first]
    assert seen == [first]


async def test_run_many_writes_every_row(db: Database) -> None:
    """`run_many` executes once per parameter set."""
    ids = [uuid.uuid4() for _ in range(5)]
    async with db.transaction() as conn:
        await _ADD_USER.run_many(conn, [{"id": i, "name": f"many-{i.hex}", "at": NOW} for i in ids])
    async with db.read() as conn:
        assert sorted(await _USERS.scalars(conn, {"ids": payload(db.dialect, ids)})) == sorted(ids)


async def test_run_rows_writes_rows_given_in_parameter_order(db: Database) -> None:
    """`run_rows` takes each row's values in the statement's parameter order, converted as
    `run_many` converts them (ids, timestamps); another order is refused before anything is
    sent."""
    statement = insert_columns(users, ("id", "name", "role", "created_at"))
    ids = [uuid.uuid4() for _ in range(3)]
    later = NOW + timedelta(seconds=1)
    with pytest.raises(ValueError, match="takes"):
        async with db.transaction() as conn:
            await statement.run_rows(conn, ("name", "id", "role", "created_at"), [])
            await statement.run_rows(
                conn, ("name", "id", "role", "created_at"), [("x", ids[0], "user", NOW)]
            )
    async with db.transaction() as conn:
        await statement.run_rows(
            conn,
            ("id", "name", "role", "created_at"),
            [(i, f"rows-{n}", "user", later) for n, i in enumerate(ids)],
        )
    async with db.read() as conn:
        found = await _USERS.rows(conn, {"ids": payload(db.dialect, ids)})
    assert [(row.id, row.name, row.created_at) for row in found] == [
        (i, f"rows-{n}", later) for n, i in enumerate(ids)
    ]


async def test_row_inserts_copy_on_postgresql_and_insert_on_sqlite(db: Database) -> None:
    """`insert_columns` rows arrive as written (ids, aware times, JSON, NULL), through one COPY
    on PostgreSQL and the INSERT on SQLite, and statement listeners see which."""
    statement = insert_columns(
        events, ("kind", "entity_type", "entity_id", "owner_id", "payload", "created_at")
    )
    owner = uuid.uuid4()
    rows = [
        {
            "kind": "test.copied",
            "entity_type": "test",
            "entity_id": f"e{n}",
            "owner_id": owner if n % 2 else None,
            "payload": {"n": n, "nested": [n, "x", None]},
            "created_at": NOW + timedelta(microseconds=n),
        }
        for n in range(40)
    ]
    with recorded_statements(db) as seen:
        async with db.transaction() as conn:
            await statement.run_many(conn, rows)
    assert len(seen) == 1
    assert seen[0].startswith("COPY events" if db.dialect == "postgresql" else "INSERT INTO")
    async with db.read() as conn:
        found = (
            await conn.execute(
                sa.select(
                    events.c.entity_id, events.c.owner_id, events.c.payload, events.c.created_at
                )
                .where(events.c.kind == "test.copied")
                .order_by(events.c.id)
            )
        ).all()
    assert [tuple(row) for row in found] == [
        (r["entity_id"], r["owner_id"], r["payload"], r["created_at"]) for r in rows
    ]


async def test_a_violation_in_a_batch_of_rows_writes_none_of_them(db: Database) -> None:
    """A duplicate key among many rows (a COPY on PostgreSQL) raises IntegrityError and the
    transaction keeps none of the rows, those before it included."""
    statement = insert_columns(users, ("id", "name", "role", "created_at"))
    existing = await add_user(db)
    ids = [uuid.uuid4() for _ in range(10)]
    rows = [{"id": i, "name": f"batch-{i.hex}", "role": "user", "created_at": NOW} for i in ids]
    rows.append({"id": existing, "name": "again", "role": "user", "created_at": NOW})
    with pytest.raises(sa.exc.IntegrityError):
        async with db.transaction() as conn:
            await statement.run_many(conn, rows)
    async with db.read() as conn:
        assert await _USERS.scalars(conn, {"ids": payload(db.dialect, ids)}) == []


async def test_driver_errors_are_sqlalchemys(db: Database) -> None:
    """A constraint violation raises SQLAlchemy's IntegrityError and rolls the transaction back."""
    existing = await add_user(db)
    fresh = uuid.uuid4()
    with pytest.raises(sa.exc.IntegrityError):
        async with db.transaction() as conn:
            await _ADD_USER.run(conn, {"id": fresh, "name": "fresh", "at": NOW})
            await _ADD_USER.run(conn, {"id": existing, "name": "dup", "at": NOW})
    async with db.read() as conn:
        assert await _USERS.scalars(conn, {"ids": payload(db.dialect, [fresh])}) == []


async def test_a_missing_parameter_is_named(db: Database) -> None:
    """Leaving out a parameter fails before anything is sent, naming the parameter."""
    async with db.read() as conn:
        with pytest.raises(sa.exc.ArgumentError, match="ids"):
            await _USERS.rows(conn, {})


async def test_statement_listeners_see_direct_statements(db: Database) -> None:
    """`before_cursor_execute` listeners (statement counters) see every direct statement."""
    with recorded_statements(db) as seen:
        async with db.read() as conn:
            await _USERS.rows(conn, {"ids": payload(db.dialect, [uuid.uuid4()])})
    assert [s for s in seen if "FROM users" in s]


async def test_sql_that_changes_per_execution_is_refused(db: Database) -> None:
    """An expanding IN would render differently for each list: such a statement is refused."""
    statement = DirectStatement(lambda _dialect: sa.select(users.c.id).where(users.c.id.in_([])))
    async with db.read() as conn:
        with pytest.raises(ValueError, match="in_param"):
            await statement.rows(conn)


class _CountingText(sa.TypeDecorator[str]):
    """Text whose parameter conversion counts its calls."""

    impl = sa.String()
    cache_ok = True
    calls = 0

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        type(self).calls += 1
        return value


async def test_run_many_converts_a_value_the_rows_share_once(db: Database) -> None:
    """A value every row shares (here the role; in a batch of history, its timestamp) is
    converted once per batch, not once per row; distinct values each once; all rows written."""
    statement = DirectStatement(
        lambda _dialect: users.insert().values(
            id=sa.bindparam("id"),
            name=sa.bindparam("name", type_=_CountingText()),
            role=sa.bindparam("role", type_=_CountingText()),
            created_at=sa.bindparam("at"),
        )
    )
    ids = [uuid.uuid4() for _ in range(4)]
    _CountingText.calls = 0
    async with db.transaction() as conn:
        await statement.run_many(
            conn,
            [{"id": i, "name": f"direct-{i.hex}", "role": "user", "at": NOW} for i in ids],
        )
    assert _CountingText.calls == len(ids) + 1  # four names, one role
    async with db.read() as conn:
        assert sorted(await _USERS.scalars(conn, {"ids": payload(db.dialect, ids)})) == sorted(ids)


async def test_run_counts_the_rows_a_returning_statement_changed(db: Database) -> None:
    """`run` on a statement with RETURNING completes it and counts its rows (sqlite3 reports
    such a statement's count only once its rows are read)."""
    renamed = DirectStatement(
        lambda dialect: (
            users.update()
            .where(in_param(dialect, users.c.id, "ids"))
            .values(name=users.c.name + "-r")
            .returning(users.c.id)
        )
    )
    ids = [await add_user(db) for _ in range(3)]
    async with db.transaction() as conn:
        assert await renamed.run(conn, {"ids": payload(db.dialect, ids)}) == 3
