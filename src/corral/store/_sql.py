"""Small SQL building blocks shared by the repositories."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal

from corral.domain.record import record
from corral.store._json import dumps
from corral.store.database import Dialect


@record
class IdBatch:
    """A batch of ids encoded once for `in_values`, so several statements can share it."""

    values: tuple[Any, ...]
    payload: Any  # JSON text on SQLite, a list on PostgreSQL

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Any:
        return iter(self.values)

    def __contains__(self, item: object) -> bool:
        return item in self.values


def id_batch(dialect: Dialect, values: Collection[Any]) -> IdBatch:
    """Encode `values` (UUIDs or strings) for `in_values` on `dialect`."""
    items = tuple(values)
    if dialect == "postgresql":
        return IdBatch(items, list(items))
    if items and isinstance(items[0], uuid.UUID):
        return IdBatch(items, dumps([v.hex for v in items]))
    return IdBatch(items, dumps(items))


def in_values(
    dialect: Dialect, column: sa.ColumnElement[Any], values: Collection[Any] | IdBatch
) -> sa.ColumnElement[bool]:
    """`column IN values` with a single bound parameter, whatever the number of values.

    PostgreSQL gets `IN (SELECT unnest(:array))`, SQLite `IN (SELECT value FROM json_each(:json))`.
    Both avoid one parameter per value (SQLite caps a statement at 32,766) and keep the statement
    text identical across batch sizes, so it is compiled and prepared once. It is a small construct
    of its own (compiled below) rather than a `json_each` table-valued subquery: building that
    cost 110 µs per call, a fifth of a busy manager's CPU.
    """
    batch = values if isinstance(values, IdBatch) else id_batch(dialect, values)
    return _InValues(column, sa.bindparam(None, batch.payload, type_=_param_type(dialect, column)))


_TEXT = sa.String()


def in_param(dialect: Dialect, column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
    """`in_values` for a statement built once: the values come at execution, `{name: payload}`.

    Building a statement costs far more than running it for the small batches of a quiet
    manager; a hot statement is built once (cached per dialect) with this in its WHERE, and
    executed with `payload(dialect, values)` under `name`.
    """
    return _InValues(column, sa.bindparam(name, type_=_param_type(dialect, column)))


def payload(dialect: Dialect, values: Collection[Any] | IdBatch) -> Any:
    """The value of an `in_param` parameter for `values`."""
    return (values if isinstance(values, IdBatch) else id_batch(dialect, values)).payload


def _param_type(dialect: Dialect, column: sa.ColumnElement[Any]) -> sa.types.TypeEngine[Any]:
    """An id list's parameter type: an array of the column's type, or JSON text on SQLite."""
    return _pg_array(column.type) if dialect == "postgresql" else _TEXT


@functools.cache
def _pg_array(item: sa.types.TypeEngine[Any]) -> postgresql.ARRAY[Any]:
    return postgresql.ARRAY(item)


class _InValues(sa.sql.expression.ColumnElement[bool]):
    """`column` is one of the values in one bound parameter (see `in_values`)."""

    __visit_name__ = "corral_in_values"
    inherit_cache = True
    type = sa.Boolean()
    # A condition in itself: rendered as is, never as `(...) = 1` where booleans are integers.
    _is_implicitly_boolean = True
    _traverse_internals = [  # noqa: RUF012 (SQLAlchemy's own convention)
        ("column", InternalTraversal.dp_clauseelement),
        ("param", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: sa.ColumnElement[Any], param: sa.BindParameter[Any]) -> None:
        self.column = column
        self.param = param


@compiles(_InValues, "postgresql")
def _in_values_postgresql(element: _InValues, compiler: Any, **kw: Any) -> str:
    # Not `= ANY (:array)`: asyncpg prepares every statement, and from its sixth run PostgreSQL
    # may keep a generic plan, in which `= ANY` over a parameter is a linear search per row
    # (hashed only for a constant array). On a small table read whole (1,000 agents, 1,000 ids)
    # that took 25 ms instead of 1.3 ms. A semi-join with the unnested array is planned as a
    # join, by hash or by index, whatever the plan.
    column, param = compiler.process(element.column, **kw), compiler.process(element.param, **kw)
    return f"{column} IN (SELECT unnest({param}))"


@compiles(_InValues)
def _in_values_sqlite(element: _InValues, compiler: Any, **kw: Any) -> str:
    column = compiler.process(element.column, **kw)
    return f"{column} IN (SELECT value FROM json_each({compiler.process(element.param, **kw)}))"


def slot_entries(dialect: Dialect, column: sa.ColumnElement[Any]) -> Any:
    """The (key, value) rows of a JSON slot map column, to join and sum slot by slot in SQL.

    `jsonb_each_text` on PostgreSQL, `json_each` on SQLite; join it `ON true` to the table
    holding `column`, and cast `value` to an integer to add the amounts up.
    """
    each_fn = sa.func.jsonb_each_text if dialect == "postgresql" else sa.func.json_each
    return each_fn(column).table_valued("key", "value")


def in_constants(column: sa.ColumnElement[Any], values: Collection[str]) -> sa.ColumnElement[bool]:
    """`column IN ('a', 'b')` with the values written into the SQL (statuses, kinds: constants).

    For statements built once and run directly (`_direct`): a plain `in_` with a list renders
    its values at execution time. Written as literals, they also let PostgreSQL plan for these
    very values when it keeps a generic plan for a prepared statement.
    """
    if not values:
        return sa.false()
    quoted = ("'" + value.replace("'", "''") + "'" for value in sorted(values))
    return column.in_([sa.literal_column(text, sa.String()) for text in quoted])
