"""UUIDs read back from SQLite, which stores them as 32 hex digits, made in half the time.

`uuid.UUID(text)` first strips the other forms it accepts (braces, dashes, `urn:uuid:`), then
parses; a 20,000-session `corral simulate` reads a few hundred thousand ids, and that parsing
was about 2 % of its run (0.76 µs an id through SQLAlchemy's converter, 0.37 µs here). A value
that is not 32 hex digits still goes through `uuid.UUID`, which raises as it would.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown
_LIMIT = 1 << 128


def uuid_from_hex(text: str) -> uuid.UUID:
    """`uuid.UUID(text)` for the 32 hex digits of a stored id, without the other forms'
    handling: the fields set as `UUID.__init__` sets them."""
    if len(text) == 32:
        number = int(text, 16)
        if 0 <= number < _LIMIT:
            value = _new(uuid.UUID)
            _set(value, "int", number)
            _set(value, "is_safe", _UNKNOWN)
            return value
    return uuid.UUID(text)


def _checked() -> bool:
    """Whether this interpreter's UUID keeps its fields as `uuid_from_hex` sets them."""
    probe = uuid.uuid4()
    made = uuid_from_hex(probe.hex)
    return (made, hash(made), str(made), made.hex) == (probe, hash(probe), str(probe), probe.hex)


_FAST = _checked()


def uuid_result_processor(
    column_type: sa.types.TypeEngine[Any], dialect: sa.Dialect
) -> Callable[[Any], Any] | None:
    """The converter of a column's values read on `dialect`: `uuid_from_hex` for a `Uuid`
    on SQLite, else the type's own."""
    uuids = isinstance(column_type, sa.Uuid) and column_type.as_uuid
    if _FAST and uuids and dialect.name == "sqlite":
        return _or_none
    return column_type._cached_result_processor(dialect, None)


def _or_none(value: Any) -> Any:
    return None if value is None else uuid_from_hex(value)
