"""pydantic's validation errors in corral's words: field paths and messages."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from corral.domain.field_errors import FieldError, describe, field_errors
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionSpec


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=0, le=10)
    ratio: float = Field(default=1.0, gt=0, lt=5)
    mode: Literal["fast", "slow"] = "fast"
    label: str = Field(default="x", max_length=3)
    items: list[int] = Field(default_factory=list, max_length=2)
    resources: ResourceSlots = ResourceSlots({"cpu": 1})
    word: str = "ok"

    @field_validator("word")
    @classmethod
    def _check_word(cls, value: str) -> str:
        if value != "ok":
            raise ValueError(f"word {value!r} is not ok; say ok")
        return value


def _errors(**fields: Any) -> list[FieldError]:
    with pytest.raises(ValidationError) as caught:
        _Model.model_validate(fields)
    return field_errors(caught.value)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"count": -1}, FieldError("count", "must be 0 or more")),
        ({"count": 11}, FieldError("count", "must be 10 or less")),
        ({"count": "many"}, FieldError("count", "must be a whole number")),
        ({"ratio": 0}, FieldError("ratio", "must be more than 0")),
        ({"ratio": 5}, FieldError("ratio", "must be less than 5")),
        ({"mode": "slowish"}, FieldError("mode", "must be 'fast' or 'slow'")),
        ({"label": "long"}, FieldError("label", "must be at most 3 characters")),
        ({"items": [1, 2, 3]}, FieldError("items", "must have at most 2 items")),
        ({"items": ["a"]}, FieldError("items.0", "must be a whole number")),
        ({"colour": "blue"}, FieldError("colour", "is not a known field; check its spelling")),
        ({"word": "no"}, FieldError("word", "word 'no' is not ok; say ok")),
        ({"resources": {"cpu": -1}}, FieldError("resources.cpu", "must not be negative (got -1)")),
        ({"resources": "cpu=1,mem=4x"}, FieldError("resources.mem", "unknown unit 'x' in '4x'")),
    ],
)
def test_each_error_reads_as_field_and_plain_message(
    fields: dict[str, Any], expected: FieldError
) -> None:
    """Each kind of error is located at its field (a slot's under `resources`) in our words."""
    [error] = _errors(**fields)
    assert error.field == expected.field
    assert error.message.startswith(expected.message)
    for pydantic_words in ("Value error", "Input should", "should have"):
        assert pydantic_words not in error.message


def test_request_parts_are_dropped_and_a_prefix_can_be_added() -> None:
    """`body.`/`query.` are implied by the route; `under` nests errors of a sub-document."""
    with pytest.raises(ValidationError) as caught:
        SessionSpec.model_validate({"command": ["true"]})
    details = [{**caught.value.errors()[0], "loc": ("body", "image")}]
    assert field_errors(details) == [FieldError("image", "is required")]  # type: ignore[arg-type]
    assert field_errors(caught.value, under=("spec",)) == [FieldError("spec.image", "is required")]


def test_describe_joins_errors_on_one_line() -> None:
    """Several errors read `a: ...; b: ...`, and a field-less error is its message alone."""
    errors = [FieldError("priority", "must be 100 or less"), FieldError("", "bad request")]
    assert describe(errors) == "priority: must be 100 or less; bad request"
