"""Ending the long-lived responses when the manager stops.

A followed event stream, a dashboard's stream and a followed log last as long as their client
wants. uvicorn's graceful shutdown waits for every open response, so one open dashboard held a
stopping manager for its whole grace period (10 s) and then had its task cancelled, with a
traceback on the console. `ApiContext.closing` is set as the manager begins to stop; each such
body is read through `until_closing`, which ends it then. A client sees its stream end: a
browser's EventSource connects again, the SDK says the stream was lost (`corral.client`), and
a followed log's reader learns from the session's status whether it ended (API reference).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def until_closing(body: AsyncIterator[T], closing: asyncio.Event) -> AsyncGenerator[T, None]:
    """`body`'s items until it ends or `closing` is set; `body` is closed either way."""
    stop = asyncio.ensure_future(closing.wait())
    item: asyncio.Future[T] | None = None
    try:
        while True:
            # The next item is awaited in a task of its own, so that `closing` can end the wait.
            item = asyncio.ensure_future(anext(body))
            await asyncio.wait({item, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                return  # closing: the item's task is ended below
            try:
                value = item.result()
            except StopAsyncIteration:
                return
            item = None
            yield value
    finally:
        stop.cancel()
        if item is not None:
            # Also when this generator itself was cancelled meanwhile: `body` must not be
            # closed while its next item is still being made.
            item.cancel()
            await asyncio.wait({item})
            if not item.cancelled():
                item.exception()  # retrieved: a StopAsyncIteration is no error to report
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            await aclose()
