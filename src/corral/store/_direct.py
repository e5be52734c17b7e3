"""Hot statements compiled once and run on the driver's own connection, inside the transaction.

SQLAlchemy does a lot of work for every execution of a statement, even one it has compiled and
cached: it generates the statement's cache key, looks the compiled form up, builds an execution
context, converts the parameters, crosses from asyncio into a greenlet and back, and wraps the
cursor in a result. For one indexed single-row SELECT that is 47 µs on SQLite, where the driver
alone takes 4 µs, and 172 µs against 96 µs on PostgreSQL. A manager's lifecycle runs about twenty
statements per session, so at 100 submissions per second this overhead was close to half of a
busy manager's CPU.

`DirectStatement` keeps SQLAlchemy for what it is good at (building the statement and compiling
it to each dialect's SQL, with its types' parameter and result conversions) and does the rest
itself, once per dialect: the SQL text, the order of its parameters, the conversion functions,
and a row class. Each execution then converts the parameters, runs the SQL on the connection
underneath the caller's `AsyncConnection` (so it belongs to the caller's transaction) and
converts the rows. Statement listeners (`before_cursor_execute` / `after_cursor_execute`) still
see every statement, and driver errors become SQLAlchemy's exception classes, as they would.

Only statements whose SQL is the same for every execution qualify: no `IN` with expanding
parameters (use `_sql.in_param`), nothing rendered at execution time.

Row inserts (`insert_columns`) run many rows on PostgreSQL as one binary COPY into the table,
not as asyncpg's `executemany`, which binds and executes the INSERT once per row: PostgreSQL
starts an executor for each. For 20,000 kernel history rows in batches of 500, COPY took 7.75
µs of the server's CPU a row against 14.5, 4.5 µs of the manager's against 6.0, and half the
wall time; from 4 rows a batch the server's CPU is lower, and a single row takes no longer. The
same codecs encode the values, and the table's constraints, domains and foreign keys are
checked as for an INSERT.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.store._uuids import uuid_result_processor
from corral.store.database import Dialect

_Convert = Callable[[Any], Any]
_ROWCOUNT = re.compile(r"(\d+)\s*$")  # the count at the end of "UPDATE 3", "INSERT 0 5"


@record
class _Compiled:
    sql: str
    names: tuple[str, ...]  # the parameters in the order the SQL takes them
    defaults: Mapping[str, Any]  # values bound when the statement was built
    binds: tuple[tuple[int, _Convert], ...]  # (position, conversion) where there is one
    results: tuple[tuple[int, _Convert], ...]  # (column, conversion) where there is one
    row: Callable[[Sequence[Any]], Any]  # makes a row with the columns as attributes
    copy_into: str | None  # PostgreSQL: run_many copies the rows into this table (its columns
    # named as the parameters, in their order) instead of executing the statement per row


class DirectStatement:
    """A statement built and compiled once per dialect, run on the driver connection."""

    __slots__ = ("_build", "_compiled", "_copy_into")

    def __init__(
        self, build: Callable[[Dialect], sa.Executable], *, copy_into: str | None = None
    ) -> None:
        self._build = build
        self._compiled: dict[str, _Compiled] = {}
        self._copy_into = copy_into

    async def rows(
        self, conn: AsyncConnection, params: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """The rows the statement returns (named tuples: `row.column` or by position)."""
        compiled = self._compile(conn)
        raw = await _run(conn, compiled, _args(compiled, params), fetch=True)
        return _rows(compiled, cast(list[Sequence[Any]], raw))

    async def scalars(
        self, conn: AsyncConnection, params: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """The first column of every row."""
        compiled = self._compile(conn)
        raw = cast(list[Sequence[Any]], await _run(conn, compiled, _args(compiled, params), True))
        convert = next((f for column, f in compiled.results if column == 0), None)
        if convert is None:
            return [row[0] for row in raw]
        return [convert(row[0]) for row in raw]

    async def run(self, conn: AsyncConnection, params: Mapping[str, Any] | None = None) -> int:
        """Execute for its effect; the number of rows it changed."""
        compiled = self._compile(conn)
        return cast(int, await _run(conn, compiled, _args(compiled, params), fetch=False))

    async def run_many(self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per parameter set (one driver call: pipelined on PostgreSQL)."""
        if not rows:
            return
        compiled = self._compile(conn)
        await _run_many(conn, compiled, _args_many(compiled, rows))

    async def run_rows(
        self, conn: AsyncConnection, names: tuple[str, ...], rows: Sequence[Sequence[Any]]
    ) -> None:
        """`run_many` with each row's values in the order of `names`, which must be the order
        the statement takes its parameters (checked): no mapping made and read per row."""
        if not rows:
            return
        compiled = self._compile(conn)
        if names != compiled.names:
            raise ValueError(f"the statement takes {compiled.names}, not {names}")
        await _run_many(conn, compiled, _convert_rows(compiled, [list(row) for row in rows]))

    def _compile(self, conn: AsyncConnection) -> _Compiled:
        dialect = conn.dialect
        found = self._compiled.get(dialect.name)
        if found is None:
            name: Dialect = "postgresql" if dialect.name == "postgresql" else "sqlite"
            copy_into = self._copy_into if name == "postgresql" else None
            found = self._compiled[dialect.name] = _compile(self._build(name), dialect, copy_into)
        return found


def insert_columns(table: sa.Table, columns: Sequence[str]) -> DirectStatement:
    """An INSERT of `columns` of `table`, each from the parameter of the column's name.

    For `run_many` with rows whose keys are those columns: on PostgreSQL a COPY into the table.
    `inline`: compiled as a single-row insert it would otherwise return the new ids on
    PostgreSQL, which `run_many` never reads.
    """
    values = {name: sa.bindparam(name, type_=table.c[name].type) for name in columns}
    return DirectStatement(
        lambda _dialect: table.insert().values(values).inline(), copy_into=table.name
    )


def _compile(
    statement: sa.Executable, dialect: sa.Dialect, copy_into: str | None = None
) -> _Compiled:
    compiled = cast(Any, statement).compile(dialect=dialect)
    if compiled.literal_execute_params or compiled.post_compile_params:
        raise ValueError(
            "a direct statement's SQL must not change between executions; "
            "use _sql.in_param instead of IN with a list"
        )
    names = tuple(compiled.positiontup or ())
    # Parameters declared without a value must be given at every execution.
    required = {name for bind, name in compiled.bind_names.items() if bind.required}
    processors = compiled._bind_processors
    results: list[tuple[int, _Convert]] = []
    keys: list[str] = []
    for column, entry in enumerate(compiled._result_columns):
        keys.append(entry.keyname)
        convert = uuid_result_processor(entry.type, dialect)
        if convert is not None:
            results.append((column, convert))
    row: Callable[[Sequence[Any]], Any] = tuple
    if keys:
        row = namedtuple("Row", keys, rename=True)._make  # type: ignore[attr-defined]
    return _Compiled(
        sql=compiled.string,
        names=names,
        defaults={
            name: value
            for name, value in compiled.construct_params(_check=False).items()
            if name not in required
        },
        binds=tuple(
            (position, processors[name])
            for position, name in enumerate(names)
            if processors.get(name) is not None
        ),
        results=tuple(results),
        row=row,
        copy_into=copy_into,
    )


def _args(compiled: _Compiled, params: Mapping[str, Any] | None) -> list[Any]:
    args = _positional(compiled, params)
    for position, convert in compiled.binds:
        value = args[position]
        if value is not None:
            args[position] = convert(value)
    return args


def _args_many(compiled: _Compiled, rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """`_args` of every row, converting a value the rows share (a batch's timestamp) once."""
    return _convert_rows(compiled, [_positional(compiled, params) for params in rows])


def _convert_rows(compiled: _Compiled, rows: list[list[Any]]) -> list[list[Any]]:
    """Rows of values in SQL order converted for the driver, in place; a value the rows share
    (the same object: a batch's timestamp, an owner) converted once.

    A column at a time, each with its own memo keyed by the value's id: a memo of every
    (position, id) pair made a tuple per value (13 against 20 ms for 20,000 rows of 4 ids
    and times)."""
    for position, convert in compiled.binds:
        converted: dict[int, Any] = {}  # id of the value → converted
        for args in rows:
            value = args[position]
            if value is None:
                continue
            # The caller's rows still hold every original value, so no id is reused meanwhile.
            found = converted.get(id(value), _MISSING)
            if found is _MISSING:
                found = converted[id(value)] = convert(value)
            args[position] = found
    return rows


def _positional(compiled: _Compiled, params: Mapping[str, Any] | None) -> list[Any]:
    """The statement's parameter values in SQL order, unconverted; a missing one is named."""
    if not params:
        values = compiled.defaults
    elif compiled.defaults:
        values = {**compiled.defaults, **params}
    else:
        values = params
    try:
        return [values[name] for name in compiled.names]
    except KeyError as missing:
        raise sa.exc.ArgumentError(f"no value for the statement's parameter {missing}") from None


_MISSING = object()


def _rows(compiled: _Compiled, raw: list[Sequence[Any]]) -> list[Any]:
    make = compiled.row
    if not compiled.results:
        return [make(row) for row in raw]
    out = []
    for row in raw:
        values = list(row)
        for column, convert in compiled.results:
            values[column] = convert(values[column])
        out.append(make(values))
    return out


async def _run(
    conn: AsyncConnection, compiled: _Compiled, args: list[Any], fetch: bool
) -> list[Any] | int:
    sync_conn = conn.sync_connection
    assert sync_conn is not None
    fairy = sync_conn.connection
    _before(sync_conn, compiled.sql, args, many=False)
    result: list[Any] | int
    try:
        if conn.dialect.name == "postgresql":
            adapted = cast(Any, fairy.dbapi_connection)
            async with adapted._execute_mutex:
                await _in_transaction(adapted)
                if fetch:
                    result = list(await adapted._connection.fetch(compiled.sql, *args))
                else:
                    status = await adapted._connection.execute(compiled.sql, *args)
                    found = _ROWCOUNT.search(status or "")
                    result = int(found.group(1)) if found else -1
        else:
            cursor = _sqlite(fairy).execute(compiled.sql, args)
            if fetch:
                result = cursor.fetchall()
            else:
                if cursor.description is not None:
                    # RETURNING rows: sqlite3 steps such a statement as they are fetched, so
                    # its writes are only all done once every row has been.
                    cursor.fetchall()
                result = cursor.rowcount
    except Exception as error:
        raise await _translated(conn, compiled.sql, args, error) from error
    _after(sync_conn, compiled.sql, args, many=False)
    return result


async def _run_many(conn: AsyncConnection, compiled: _Compiled, rows: list[list[Any]]) -> None:
    sync_conn = conn.sync_connection
    assert sync_conn is not None
    fairy = sync_conn.connection
    copy_into = compiled.copy_into
    # What statement listeners see for a COPY: what it does, in SQL.
    sql = compiled.sql if copy_into is None else _copy_sql(copy_into, compiled.names)
    _before(sync_conn, sql, rows, many=True)
    try:
        if conn.dialect.name == "postgresql":
            adapted = cast(Any, fairy.dbapi_connection)
            async with adapted._execute_mutex:
                await _in_transaction(adapted)
                if copy_into is None:
                    await adapted._connection.executemany(compiled.sql, rows)
                else:
                    await adapted._connection.copy_records_to_table(
                        copy_into, records=rows, columns=compiled.names
                    )
        else:
            _sqlite(fairy).executemany(compiled.sql, rows)
    except Exception as error:
        raise await _translated(conn, sql, rows, error) from error
    _after(sync_conn, sql, rows, many=True)


def _copy_sql(table: str, columns: Sequence[str]) -> str:
    return f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT binary)"


async def _in_transaction(adapted: Any) -> None:
    """Begin the transaction SQLAlchemy's asyncpg adapter would begin at its first statement.

    The adapter starts a transaction lazily, when it runs a statement (with the isolation level
    and read-only flag the connection was given); a statement sent straight to asyncpg before
    that would run on its own, outside the caller's transaction.
    """
    if adapted._transaction is None and not adapted.autocommit:
        await adapted._start_transaction()


def _sqlite(fairy: Any) -> Any:
    # The aiosqlite connection underneath runs its calls inline (see _inline_sqlite); its
    # sqlite3 connection is called directly, already inside the transaction's BEGIN.
    return fairy.driver_connection._connection


def _before(sync_conn: sa.Connection, sql: str, args: Any, many: bool) -> None:
    if sync_conn._has_events or sync_conn.engine._has_events:
        sync_conn.dispatch.before_cursor_execute(sync_conn, None, sql, args, None, many)


def _after(sync_conn: sa.Connection, sql: str, args: Any, many: bool) -> None:
    if sync_conn._has_events or sync_conn.engine._has_events:
        sync_conn.dispatch.after_cursor_execute(sync_conn, None, sql, args, None, many)


async def _translated(conn: AsyncConnection, sql: str, args: Any, error: Exception) -> Exception:
    """`error` as SQLAlchemy would raise it (IntegrityError, OperationalError, ...)."""
    dialect = conn.dialect
    original: Exception = error
    if dialect.name == "postgresql":
        adapted = cast(Any, conn.sync_connection).connection.dbapi_connection
        try:
            adapted._handle_exception(error)  # always raises: the driver error in DBAPI terms
        except Exception as dbapi_error:
            original = dbapi_error
    dbapi = cast(Any, dialect).loaded_dbapi
    if not isinstance(original, dbapi.Error):
        return error
    invalidated = dialect.is_disconnect(original, None, None)
    if invalidated:
        await conn.invalidate(original)
    return cast(
        Exception,
        sa.exc.DBAPIError.instance(
            sql, args, original, dbapi.Error, connection_invalidated=invalidated, dialect=dialect
        ),
    )
