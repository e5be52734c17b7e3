"""Small SQL building blocks shared by the repositories."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from corral.store.database import Dialect


def in_values(dialect: Dialect, column: sa.ColumnElement[Any], values: Collection[Any]) -> Any:
    """`column IN values` with a single bound parameter, whatever the number of values.

    PostgreSQL gets `= ANY(:array)`; SQLite gets `IN (SELECT value FROM json_each(:json))`. Both
    avoid one parameter per value (SQLite caps a statement at 32,766) and keep the statement text
    identical across batch sizes, so it is compiled and prepared once.
    """
    items = list(values)
    if dialect == "postgresql":
        param = sa.bindparam(None, items, type_=postgresql.ARRAY(column.type))
        return column == sa.any_(param)
    if isinstance(column.type, sa.Uuid):
        payload = json.dumps([v.hex for v in items])
    else:
        payload = json.dumps(items)
    each = sa.func.json_each(sa.bindparam(None, payload, type_=sa.String())).table_valued("value")
    return column.in_(sa.select(each.c.value))
