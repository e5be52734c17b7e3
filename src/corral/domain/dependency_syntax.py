"""Slurm's dependency syntax as `corral run --after` / `--dependency` and job files' `after`
take it: session references with a kind, parsed without resolving them (the CLI resolves them
through the API, `cli._dependencies`).

`--after 12,afterany:13` and `--dependency afterok:12:14,afternotok:13` name sessions by any
reference the API resolves (a full id, a unique id prefix, a name, a number, `12_7`), each with
a kind: `--after` defaults to afterok, `--dependency` always says it, as Slurm's does.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.domain.outcome import DEFAULT_DEPENDENCY_KIND, DependencyKind

_KINDS = ", ".join(kind.value for kind in DependencyKind)


class DependencySyntaxError(ValueError):
    """A `--after` or `--dependency` value that does not parse; the message says why."""


def parse_after(values: Iterable[str]) -> list[tuple[str, DependencyKind]]:
    """`--after` values: comma-separated `REF` (afterok) or `KIND:REF[:REF…]` items."""
    return [
        found
        for value in values
        for item in _items(value, "--after")
        for found in _item(item, "--after", kind_required=False)
    ]


def parse_dependency(values: Iterable[str]) -> list[tuple[str, DependencyKind]]:
    """`--dependency` values: comma-separated `KIND:REF[:REF…]` items (Slurm's form)."""
    return [
        found
        for value in values
        for item in _items(value, "--dependency")
        for found in _item(item, "--dependency", kind_required=True)
    ]


def _items(value: str, flag: str) -> list[str]:
    if "?" in value:
        raise DependencySyntaxError(
            f"{flag} {value!r}: '?' (any one of) is not supported; list dependencies with ','"
        )
    items = value.split(",")
    if any(not item.strip() for item in items):
        raise DependencySyntaxError(f"{flag} {value!r}: an empty item; separate items with ','")
    return [item.strip() for item in items]


def _item(item: str, flag: str, *, kind_required: bool) -> list[tuple[str, DependencyKind]]:
    head, sep, rest = item.partition(":")
    if not sep:
        if kind_required:
            raise DependencySyntaxError(
                f"{flag} {item!r}: give a kind and sessions, like afterok:12 ({_KINDS})"
            )
        return [(item, DEFAULT_DEPENDENCY_KIND)]
    try:
        kind = DependencyKind(head.lower())
    except ValueError:
        raise DependencySyntaxError(
            f"{flag} {item!r}: unknown dependency kind {head!r}; use one of {_KINDS}"
        ) from None
    refs = rest.split(":")
    if any(not ref for ref in refs):
        raise DependencySyntaxError(
            f"{flag} {item!r}: name a session after each ':', like {kind.value}:12:13"
        )
    return [(ref, kind) for ref in refs]
