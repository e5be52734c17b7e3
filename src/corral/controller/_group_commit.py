"""Group commit: calls that arrive while a batch is being written go together in the next one.

A thousand agents reporting at once become a few transactions instead of a thousand queued on
one writer: each caller awaits its own result, as if it had written alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    """Batches `submit` calls into `apply(items)`, one batch at a time, in arrival order.

    `apply` returns one result per item; an exception in its place is raised to that caller
    only. An exception raised by `apply` itself is raised to every caller of the batch.
    """

    def __init__(
        self,
        apply: Callable[[Sequence[Item]], Awaitable[Sequence[Result | BaseException]]],
        *,
        max_batch: int = 2_000,
    ) -> None:
        self._apply = apply
        self._max_batch = max_batch
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        """Queue `item` and wait for its result."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="group-commit")
        # Shielded: a caller that gives up does not cancel the batch the others wait on.
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        while self._queue:
            batch = self._queue[: self._max_batch]
            del self._queue[: len(batch)]
            try:
                results = await self._apply([item for item, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)
