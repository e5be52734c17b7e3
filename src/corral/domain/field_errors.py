"""Invalid input in corral's words: a field path and what is wrong with it, never pydantic's.

Pydantic writes `Value error, ...`, `Input should be greater than or equal to 0` and locations
like `('body', 'resources')`; the API's problem details, the SDK and the CLI all show
`resources.cpu: must not be negative (got -1)` instead. This module is the one translation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from corral.domain.record import record
from corral.domain.slots import SlotError

if TYPE_CHECKING:  # pydantic is imported when its errors are translated, not before
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails

# Where in an HTTP request a field was: implied by the route, so not part of the field's path.
_REQUEST_PARTS = frozenset({"body", "query", "path", "header", "cookie"})

# Our wording for pydantic's error types; `{name}` is filled from the error's context.
_BY_TYPE: dict[str, str] = {
    "missing": "is required",
    "extra_forbidden": "is not a known field; check its spelling",
    "greater_than_equal": "must be {ge} or more",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be {le} or less",
    "less_than": "must be less than {lt}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "decimal_parsing": "must be a number",
    "decimal_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "list_type": "must be a list",
    "dict_type": "must be an object of names to values",
    "model_type": "must be an object of names to values",
    "literal_error": "must be {expected}",
    "enum": "must be {expected}",
    "uuid_parsing": "must be a UUID like 0190d7a2-5c4e-7b3a-9f1e-2d3c4b5a6978",
    "uuid_type": "must be a UUID like 0190d7a2-5c4e-7b3a-9f1e-2d3c4b5a6978",
    "datetime_parsing": "must be a date and time like 2030-01-01T09:00:00Z",
    "datetime_from_date_parsing": "must be a date and time like 2030-01-01T09:00:00Z",
    "datetime_type": "must be a date and time like 2030-01-01T09:00:00Z",
    "json_invalid": "is not valid JSON ({error})",
}
# Prefixes pydantic puts before the message of an error a validator raised.
_RAISED_PREFIXES = ("Value error, ", "Assertion failed, ")


class FieldValueError(ValueError):
    """A value error about another field than the one being validated (a model's check):
    `field` is its dotted path, which `field_errors` shows instead of pydantic's location."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


@record
class FieldError:
    """One invalid field of a request: its dotted path (e.g. `resources.cpu`) and what is wrong."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def field_errors(
    errors: ValidationError | Iterable[ErrorDetails], *, under: Sequence[str] = ()
) -> list[FieldError]:
    """Each of pydantic's errors in our words, its path prefixed with `under` (e.g. `options`)."""
    from pydantic import ValidationError

    details = errors.errors() if isinstance(errors, ValidationError) else errors
    return [_field_error(detail, under) for detail in details]


def describe(errors: Iterable[FieldError]) -> str:
    """One line for people: `resources.cpu: must be 0 or more; priority: must be 100 or less`."""
    return "; ".join(str(error) for error in errors)


def plain_message(detail: ErrorDetails) -> str:
    """The message of one pydantic error in our words (without its field)."""
    context: dict[str, Any] = dict(detail.get("ctx") or {})
    raised = context.get("error")
    if isinstance(raised, SlotError | FieldValueError):
        return raised.problem
    template = _BY_TYPE.get(detail["type"])
    if template is not None:
        try:
            return template.format(**context)
        except (KeyError, IndexError):
            pass  # a context without the expected key: fall back to pydantic's own words
    message = detail["msg"]
    for prefix in _RAISED_PREFIXES:
        if message.startswith(prefix):
            return message.removeprefix(prefix)
    return message.replace("Input should", "must", 1)


def _field_error(detail: ErrorDetails, under: Sequence[str]) -> FieldError:
    parts = [str(part) for part in detail["loc"]]
    raised = (detail.get("ctx") or {}).get("error")
    if isinstance(raised, SlotError) and raised.slot is not None:
        parts.append(raised.slot)
    elif isinstance(raised, FieldValueError):
        parts.extend(raised.field.split("."))  # a model's check names its field itself
    if len(parts) > 1 and parts[0] in _REQUEST_PARTS:
        parts = parts[1:]
    return FieldError(".".join([*under, *parts]), plain_message(detail))
