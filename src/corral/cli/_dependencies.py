"""`corral run --after` and `--dependency` (and job files' `after`): Slurm's dependency syntax
(`domain.dependency_syntax`), resolved through the API. A job array's number waits for every
element of the array (afterok and afterany).
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.cli._remote import names_array
from corral.client import Client, ConflictError
from corral.domain.dependency_syntax import DependencySyntaxError, parse_after, parse_dependency
from corral.domain.outcome import DependencyKind

__all__ = ["DependencySyntaxError", "parse_after", "parse_dependency", "resolve"]


async def resolve(
    client: Client, wanted: Iterable[tuple[str, DependencyKind]]
) -> list[dict[str, str | bool]]:
    """The spec's `dependencies` for `wanted`: each reference resolved to its session's id,
    or to its job array's (`12`: every element of array 12, as Slurm's `afterok:12` waits for
    every task of array job 12)."""
    found: list[dict[str, str | bool]] = []
    for ref, kind in wanted:
        try:
            session_id = await client.resolve_session_id(ref)
        except ConflictError as exc:
            if not names_array(exc):
                raise
            array = await client.get_array(ref)
            found.append({"session": str(array.id), "kind": kind.value, "array": True})
        else:
            found.append({"session": str(session_id), "kind": kind.value})
    return found
