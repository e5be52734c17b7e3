"""Paginated lists: `limit` and an opaque `cursor` in, `{"items", "next_cursor"}` out.

A cursor is the sort key of the last item served, tagged with the listing it belongs to, so a
page is stable while items are added or removed and a cursor of one listing is refused by
another. It is opaque to clients: only the API that issued it reads it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Generic, TypeVar

from fastapi import Query
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from corral.api.problems import Problem

T = TypeVar("T")
Key = TypeVar("Key", str, int)

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_BIGINT = 2**63 - 1  # ids and offsets past it would overflow the query (a 500), not match

Limit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description=f"items per page (at most {MAX_LIMIT})")
]
Cursor = Annotated[
    str | None,
    Query(max_length=512, description="`next_cursor` of the previous page; omit for the first"),
]


class Page(BaseModel, Generic[T]):
    """One page of a list; `next_cursor` fetches the next one (null: this is the last)."""

    items: list[T]
    next_cursor: str | None = None


def encode_cursor(listing: str, key: str | int) -> str:
    """The opaque cursor that resumes `listing` after the item with sort key `key`."""
    raw = json.dumps({"l": listing, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(listing: str, cursor: str | None, key_type: type[Key]) -> Key | None:
    """The sort key a cursor of `listing` resumes after (None: start at the beginning)."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise invalid_cursor(cursor) from exc
    if not isinstance(data, dict) or data.get("l") != listing:
        raise invalid_cursor(cursor)
    key = data.get("k")
    # bool is an int to Python, never a key of ours.
    if not isinstance(key, key_type) or isinstance(key, bool):
        raise invalid_cursor(cursor)
    if isinstance(key, int) and not -MAX_BIGINT <= key <= MAX_BIGINT:
        raise invalid_cursor(cursor)
    return key


def page_of(listing: str, rows: Sequence[T], limit: int, key: Callable[[T], str | int]) -> Page[T]:
    """A page from up to `limit + 1` rows read in key order (one more tells there is more)."""
    items = list(rows[:limit])
    more = len(rows) > limit and bool(items)
    return Page[T](
        items=items, next_cursor=encode_cursor(listing, key(items[-1])) if more else None
    )


def invalid_cursor(cursor: str) -> Problem:
    """The 422 problem for a cursor this list did not issue."""
    return Problem(
        422,
        "invalid-cursor",
        "The cursor is not valid",
        f"cursor: {cursor[:40]!r} is not a cursor of this list; pass the `next_cursor` of the "
        "previous page of the same list unchanged, or omit it to start over",
        errors=[{"field": "cursor", "message": "not a cursor of this list"}],
    )


Item = TypeVar("Item")


def json_without_unencodable(
    items: Sequence[Item], build: Callable[[list[Item]], BaseModel]
) -> tuple[str, list[Item]]:
    """`build(items)` as JSON text, leaving out the items that cannot be encoded (text with a
    lone surrogate, from a row written before input was checked); those are returned.

    The page is encoded once; only when that fails is each item tried alone, so one poisoned
    row costs its reader that row, not the whole answer (`coordination.quarantine`).
    """
    body, bad = encoded_or_unencodable(items, build)
    if body is not None:
        return body, bad
    return build([item for item in items if item not in bad]).model_dump_json(), bad


def encoded_or_unencodable(
    items: Sequence[Item], build: Callable[[list[Item]], BaseModel]
) -> tuple[str | None, list[Item]]:
    """`build(items)` as JSON text and no item; or, when that cannot be encoded, None and the
    items that cannot (each tried alone)."""
    try:
        return build(list(items)).model_dump_json(), []
    except PydanticSerializationError:
        pass
    bad: list[Item] = []
    for item in items:
        try:
            build([item]).model_dump_json()
        except PydanticSerializationError:
            bad.append(item)
    return None, bad


Model = TypeVar("Model", bound=BaseModel)


def unencodable(items: Sequence[Model]) -> list[Model]:
    """The items that cannot be encoded as JSON (see `json_without_unencodable`)."""
    bad: list[Model] = []
    for item in items:
        try:
            item.model_dump_json()
        except PydanticSerializationError:
            bad.append(item)
    return bad
