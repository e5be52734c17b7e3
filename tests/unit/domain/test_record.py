"""Records: value classes, frozen to the type checker, plain slotted dataclasses at run time."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from corral.domain.record import record


@record
class Point:
    x: int
    y: int = 0


@record(kw_only=True)
class Named:
    name: str
    tags: tuple[str, ...] = ()


def test_records_compare_and_hash_by_value() -> None:
    assert Point(1, 2) == Point(1, 2) != Point(2, 1)
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert len({Point(1, 2), Point(1, 2), Point(3)}) == 2
    assert Named(name="a") == Named(name="a", tags=())


def test_a_changed_copy_is_made_with_replace() -> None:
    first = Point(1, 2)
    moved = dataclasses.replace(first, y=5)
    assert (first, moved) == (Point(1, 2), Point(1, 5))


def test_keyword_only_records_refuse_positional_arguments() -> None:
    with pytest.raises(TypeError):
        Named("a")  # type: ignore[misc]


def test_records_have_slots_and_no_instance_dict() -> None:
    assert not hasattr(Point(1), "__dict__")


def test_assigning_to_a_field_is_a_type_error(tmp_path: Path) -> None:
    """What keeps records immutable: mypy (run by `make test`) refuses the assignment."""
    source = tmp_path / "uses_record.py"
    source.write_text(
        textwrap.dedent(
            """
            from corral.domain.record import record

            @record
            class P:
                x: int

            p = P(1)
            p.x = 2
            """
        )
    )
    out, _, status = mypy_api.run(
        [str(source), "--no-incremental", "--cache-dir", str(tmp_path / "cache")]
    )
    assert status == 1
    assert 'Property "x" defined in "P" is read-only' in out
