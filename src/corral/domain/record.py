"""`record`: corral's immutable value classes, read-only to the type checker and cheap to make.

A frozen dataclass enforces immutability at run time by overriding `__setattr__`, so its
generated `__init__` must set every field through `object.__setattr__`: 1.27 µs for a record of
14 fields against 0.16 µs for the same class unfrozen. A manager makes hundreds of thousands
of records a minute under load (a session's kernels as the store reads them, events, agents'
reports), and those constructors were 4 to 5 % of a `corral simulate` run.

So a record is frozen where it is checked, by mypy (`dataclass_transform(frozen_default=True)`:
assigning to a field is a type error, and `make test` runs mypy), and a plain slotted
dataclass at run time. Equality and hashing are a frozen dataclass's: by value, over every
field (`unsafe_hash`; a record holding a dict is unhashable, as it would be frozen).
`dataclasses.replace` makes a changed copy, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T")


@overload
def record(cls: type[_T], /) -> type[_T]: ...


@overload
def record(*, kw_only: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True)
def record(cls: Any = None, /, *, kw_only: bool = False) -> Any:
    """Make `cls` a record: `@record` or `@record(kw_only=True)`."""

    def wrap(target: Any) -> Any:
        return dataclass(target, slots=True, unsafe_hash=True, kw_only=kw_only)

    return wrap if cls is None else wrap(cls)


__all__ = ["record"]
