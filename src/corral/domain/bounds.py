"""What corral accepts from anyone: text it can store and send on, and how long it may be.

Every string a request carries ends in a database column or a JSON document that PostgreSQL
refuses NUL in, and in an answer that must encode as UTF-8: a lone UTF-16 surrogate
(`"\\ud800"`, which JSON can spell) or a NUL written once made every later read of that row
fail (issue 33). `Text` is a pydantic `str` that refuses both; `check_json_text` does the same
for free-form JSON (an agent's `runtime_info`). Lengths are bounded where they could make one
request cost everyone (a 10 MB command echoed on every listing). The constants here are the
one definition that the session spec, the agent protocol, the API and the docs share.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator

from corral.domain.field_errors import FieldValueError as FieldValueError  # its models raise it

# A command as `exec` takes it: Linux refuses one argument over 128 KiB (MAX_ARG_STRLEN) and
# all of them with the environment over about 2 MiB; corral takes at most these (UTF-8 bytes).
MAX_COMMAND_ARGS = 4096
MAX_ARGUMENT_BYTES = 128 * 1024
MAX_COMMAND_BYTES = 1024 * 1024
# The environment a session asks for, likewise (names are `[A-Za-z_][A-Za-z0-9_]*`).
MAX_ENV_VARS = 1024
MAX_ENV_NAME_LENGTH = 256
MAX_ENV_VALUE_BYTES = 128 * 1024
MAX_ENV_BYTES = 1024 * 1024
# An agent's labels (`--label key=value`), and the free-form runtime facts a report carries.
MAX_LABELS = 64
MAX_LABEL_KEY_LENGTH = 64
MAX_LABEL_VALUE_LENGTH = 256
MAX_RUNTIME_INFO_BYTES = 16 * 1024
# The largest request body the API reads (a setting, `max_request_bytes`; uploads and agents'
# outputs have caps of their own). A session at every limit above fits in it.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
MIN_MAX_REQUEST_BYTES = 4 * 1024 * 1024  # a command and an env at their limits, and more
# Times a user gives (`starts_at`, `since`): within these, in UTC. Far enough for any plan,
# near enough that adding a time limit or an offset never leaves the datetime range.
EARLIEST_MOMENT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_MOMENT = datetime(3000, 1, 1, tzinfo=UTC)

# How users, resource groups and sessions are named (the API's schema shows this pattern).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RULE = "use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"

_NUL = "\0"


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored and sent on (NUL, a lone surrogate), or None."""
    if _NUL in value:
        return "must not contain NUL characters (\\u0000)"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must be valid Unicode: it holds a lone surrogate (\\ud800 to \\udfff)"
    return None


def check_text(value: str) -> str:
    """`value` if `text_problem` finds nothing; ValueError saying what is wrong otherwise."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def utf8_size(value: str) -> int:
    """How many bytes `value` takes in UTF-8 (what `exec` and the store count)."""
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


def json_text_problem(value: Any, path: str = "") -> str | None:
    """The first string (key or value) in a JSON document that `text_problem` refuses, as
    `path: problem`, or None."""
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else f"{path or 'value'}: {problem}"
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (problem := text_problem(key)) is not None:
                return f"key {where!r}: {problem}"
            if (found := json_text_problem(item, where)) is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if found := json_text_problem(item, f"{path}.{index}" if path else str(index)):
                return found
    return None


def check_json_text(value: Any) -> Any:
    """`value` if every string in it passes `text_problem`; ValueError naming the first that
    does not (its path inside the value)."""
    problem = json_text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def moment_problem(value: datetime) -> str | None:
    """Why an aware `value` is out of the times corral takes, or None."""
    if EARLIEST_MOMENT <= value < LATEST_MOMENT:
        return None
    return (
        f"must be between {EARLIEST_MOMENT:%Y-%m-%d} and {LATEST_MOMENT:%Y-%m-%d} (UTC), "
        f"like 2030-01-01T09:00:00Z"
    )


def to_utc_moment(value: datetime) -> datetime:
    """An aware time in UTC, within `EARLIEST_MOMENT` … `LATEST_MOMENT`; ValueError otherwise
    (also for a time whose offset takes it past the year 9999, which Python cannot hold)."""
    try:
        moment = value.astimezone(UTC)
    except OverflowError:
        moment = LATEST_MOMENT  # out of Python's range: out of ours too
    problem = moment_problem(moment)
    if problem is not None:
        raise ValueError(problem)
    return moment


# A string a request may carry anywhere: valid Unicode, no NUL.
Text = Annotated[str, AfterValidator(check_text)]
