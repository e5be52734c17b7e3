"""Walking a listing of the API page by page."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from corral.client.models import Page

T = TypeVar("T")


async def every_item(fetch: Callable[[str | None], Awaitable[Page[T]]]) -> AsyncGenerator[T, None]:
    """Every item of the pages `fetch(cursor)` returns, following `next_cursor` to the end."""
    cursor: str | None = None
    while True:
        page = await fetch(cursor)
        for item in page.items:
            yield item
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
