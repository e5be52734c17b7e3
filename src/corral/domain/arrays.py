"""Job arrays: Slurm's `--array` syntax, and the request that creates an array of sessions.

`0-15` is a range, `1,3,5` a list, `0-15:4` a range with a step (0, 4, 8, 12), and `%N` after
any of them caps how many of the array's elements hold resources at once (`0-999%50`). The
indexes are a set: listed twice is created once, and they are created in ascending order.
"""

from __future__ import annotations

import re

from pydantic import Field, JsonValue, field_validator

from corral.domain.record import record
from corral.domain.spec import MAX_CREATION_ID_LENGTH, SessionSpec

# The manager's default for `max_array_size` (elements of one array); a setting.
DEFAULT_MAX_ARRAY_SIZE = 10_000
MAX_ARRAY_INDEX = 2**31 - 1  # the column is an INTEGER
MAX_ARRAY_TEXT = 1024
# An element's creation_id is the array's with `_INDEX` appended (see `element_creation_id`).
_ELEMENT_SUFFIX_MAX = len(f"_{MAX_ARRAY_INDEX}")
_ITEM = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_NUMBER = re.compile(r"[0-9]+")
# The syntax as the API's schema documents it (validation is `parse_array`'s, with messages).
ARRAY_PATTERN = r"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?$"
_SYNTAX_HINT = "use Slurm's syntax, like 0-15, 1,3,5, 0-15:4 or 0-999%50"


class ArraySyntaxError(ValueError):
    """An `--array` value that is not Slurm's syntax or asks for too much."""


@record
class ArrayIndexes:
    """A parsed `--array` value: the items as (first, last, step), and the throttle."""

    items: tuple[tuple[int, int, int], ...]
    throttle: int | None  # None: no cap

    @property
    def upper_count(self) -> int:
        """How many elements the items name, counting an index named twice twice (no expanding)."""
        return sum((last - first) // step + 1 for first, last, step in self.items)

    def indexes(self) -> list[int]:
        """Every index, ascending, each once (call only after checking `upper_count`)."""
        return sorted({i for first, last, step in self.items for i in range(first, last + 1, step)})


def parse_array(text: str) -> ArrayIndexes:
    """Parse Slurm's array syntax; ArraySyntaxError says what is wrong and how to write it."""
    if not text or len(text) > MAX_ARRAY_TEXT:
        raise ArraySyntaxError(f"an array is 1 to {MAX_ARRAY_TEXT} characters; {_SYNTAX_HINT}")
    body, percent, limit = text.partition("%")
    throttle: int | None = None
    if percent:
        if _NUMBER.fullmatch(limit) is None or int(limit) < 1:
            raise ArraySyntaxError(
                f"the throttle after '%' in {text!r} must be a whole number of at least 1, "
                "like 0-999%50 (at most 50 elements at once)"
            )
        throttle = int(limit)
    items: list[tuple[int, int, int]] = []
    for part in body.split(","):
        match = _ITEM.fullmatch(part)
        if match is None:
            raise ArraySyntaxError(f"{part!r} in {text!r} is not an index or range; {_SYNTAX_HINT}")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last > MAX_ARRAY_INDEX:
            raise ArraySyntaxError(f"index {last} in {text!r} is above {MAX_ARRAY_INDEX}")
        if last < first:
            raise ArraySyntaxError(f"range {part!r} in {text!r} ends before it starts")
        if step < 1:
            raise ArraySyntaxError(f"the step of {part!r} in {text!r} must be at least 1")
        items.append((first, last, step))
    return ArrayIndexes(tuple(items), throttle)


def check_array(text: str) -> str:
    """`text` if it is valid array syntax; ArraySyntaxError (a ValueError) otherwise."""
    parse_array(text)
    return text


ARRAY_SCHEMA: dict[str, JsonValue] = {
    "pattern": ARRAY_PATTERN,
    "minLength": 1,
    "maxLength": MAX_ARRAY_TEXT,
    "examples": ["0-99", "1,3,5", "0-15:4", "0-999%50"],
    "description": "Slurm's array syntax: ranges, lists, steps; %N: at most N at once",
}


def element_creation_id(creation_id: str, index: int) -> str:
    """The creation_id of an array's element `index`: a retried request creates nothing twice."""
    return f"{creation_id}_{index}"


class ArraySpec(SessionSpec):
    """A job array: one session of this spec per index of `array` (the `/v1/arrays` body)."""

    array: str = Field(json_schema_extra=ARRAY_SCHEMA)

    @field_validator("array")
    @classmethod
    def _check_array(cls, value: str) -> str:
        return check_array(value)

    @field_validator("creation_id")
    @classmethod
    def _room_for_index(cls, value: str | None) -> str | None:
        longest = MAX_CREATION_ID_LENGTH - _ELEMENT_SUFFIX_MAX
        if value is not None and len(value) > longest:
            raise ValueError(
                f"an array's creation_id may have at most {longest} characters: "
                "each element's is it with '_INDEX' appended"
            )
        return value

    def element(self, index: int) -> SessionSpec:
        """The spec of the array's element `index` (validated already, as part of this one)."""
        fields = {name: getattr(self, name) for name in SessionSpec.model_fields}
        if self.creation_id is not None:
            fields["creation_id"] = element_creation_id(self.creation_id, index)
        return SessionSpec.model_construct(**fields)
