"""Small SQL building blocks shared by the repositories."""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from corral.store.database import Dialect


@dataclass(frozen=True, slots=True)
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
        return IdBatch(items, json.dumps([v.hex for v in items]))
    return IdBatch(items, json.dumps(items))


def in_values(
    dialect: Dialect, column: sa.ColumnElement[Any], values: Collection[Any] | IdBatch
) -> Any:
    """`column IN values` with a single bound parameter, whatever the number of values.

    PostgreSQL gets `= ANY(:array)`; SQLite gets `IN (SELECT value FROM json_each(:json))`. Both
    avoid one parameter per value (SQLite caps a statement at 32,766) and keep the statement text
    identical across batch sizes, so it is compiled and prepared once.
    """
    batch = values if isinstance(values, IdBatch) else id_batch(dialect, values)
    if dialect == "postgresql":
        param = sa.bindparam(None, batch.payload, type_=postgresql.ARRAY(column.type))
        return column == sa.any_(param)
    each = sa.func.json_each(sa.bindparam(None, batch.payload, type_=sa.String())).table_valued(
        "value"
    )
    return column.in_(sa.select(each.c.value))


def slot_entries(dialect: Dialect, column: sa.ColumnElement[Any]) -> Any:
    """The (key, value) rows of a JSON slot map column, to join and sum slot by slot in SQL.

    `jsonb_each_text` on PostgreSQL, `json_each` on SQLite; join it `ON true` to the table
    holding `column`, and cast `value` to an integer to add the amounts up.
    """
    each_fn = sa.func.jsonb_each_text if dialect == "postgresql" else sa.func.json_each
    return each_fn(column).table_valued("key", "value")
