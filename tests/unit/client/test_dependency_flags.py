"""`corral run --after` / `--dependency` parsing: Slurm's syntax to (reference, kind) pairs."""

from __future__ import annotations

import pytest

from corral.cli._dependencies import DependencySyntaxError, parse_after, parse_dependency
from corral.domain.outcome import DependencyKind

OK, ANY, NOTOK = DependencyKind.AFTEROK, DependencyKind.AFTERANY, DependencyKind.AFTERNOTOK


def test_after_takes_references_and_kinds() -> None:
    """Bare references are afterok; `KIND:REF[:REF]` items name theirs; the flag repeats."""
    assert parse_after(["12,13", "afterany:14:15", "afternotok:train"]) == [
        ("12", OK),
        ("13", OK),
        ("14", ANY),
        ("15", ANY),
        ("train", NOTOK),
    ]


def test_dependency_is_slurms_form() -> None:
    """`afterok:1:2,afterany:3` as sbatch takes it; kinds in any case."""
    assert parse_dependency(["afterok:1:2,AfterAny:3"]) == [("1", OK), ("2", OK), ("3", ANY)]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["12"], "give a kind and sessions"),
        (["after:12"], "unknown dependency kind 'after'"),
        (["afterok:"], "name a session after each ':'"),
        (["afterok:1?afterany:2"], "'?' (any one of) is not supported"),
        (["afterok:1,,afterany:2"], "an empty item"),
    ],
)
def test_dependency_errors_say_what_is_wrong(values: list[str], message: str) -> None:
    """Every malformed value is refused with a message naming the flag and the mistake."""
    with pytest.raises(DependencySyntaxError, match="--dependency") as raised:
        parse_dependency(values)
    assert message in str(raised.value)
