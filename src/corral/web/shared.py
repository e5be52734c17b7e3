"""Page data read once for every dashboard asking within a second.

Open dashboards refresh after the same events, so on a busy manager twenty of them ask for the
same page's data (the queue explained, every agent's slots, the hour's activity) within the
same second; each read on its own made those refreshes cost a fifth of the manager's
throughput under `corral simulate --dashboards 20`. A read here is keyed by what it depends
on (the page, the viewer's scope, its query); a request within `TTL_S` of the read's start
shares it, also while it is still running, instead of reading again. A failed read is shared
by those already waiting for it and then forgotten; a dashboard action (drain, terminate,
activate) forgets every read, so the page it goes back to shows what it did.

A page rendered from a shared read must say the event id read before that read started (what
`SharedReads.read` answers with the value), not its own: a page's stream starts there, so a
change that came between the shared read and this request still makes it refresh. A page that
refreshes (its script swaps the live part; the stream goes on) says the newest event it was
sent (`?seen=`): a read started before that event committed is not shared with it, or the
change it refreshes for could be missing with no event left to bring it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.responses import RedirectResponse

TTL_S = 1.0
T = TypeVar("T")


class SharedReads:
    """Reads shared between requests within `ttl_s` of their start, by key."""

    def __init__(self, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._reads: dict[Hashable, tuple[float, int, asyncio.Future[Any]]] = {}

    async def read(
        self, key: Hashable, since: int, compute: Callable[[], Awaitable[T]], *, seen: int = 0
    ) -> tuple[T, int]:
        """`compute()`'s value, or that of a read of `key` started within `ttl_s` after event
        `seen` (the newest the page was shown: what it refreshes for); and the event id to
        render the page after (`since` if this request read, else the read's)."""
        now = self.clock()
        for old in [k for k, (started, _, _) in self._reads.items() if now - started > self.ttl_s]:
            del self._reads[old]
        found = self._reads.get(key)
        if found is not None and found[1] >= seen:
            _, shared_since, reading = found
            return await asyncio.shield(reading), shared_since
        reading = asyncio.ensure_future(compute())
        self._reads[key] = (now, since, reading)
        reading.add_done_callback(lambda done: self._forget_failed(key, done))
        return await asyncio.shield(reading), since

    def forget(self) -> None:
        """Share nothing read so far: after a dashboard action, its page shows the change."""
        self._reads.clear()

    def _forget_failed(self, key: Hashable, done: asyncio.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            entry = self._reads.get(key)
            if entry is not None and entry[2] is done:
                del self._reads[key]


async def shared(request: Request, key: Hashable, compute: Callable[[], Awaitable[T]]) -> T:
    """`compute()`'s value, shared with the dashboards asking for the same `key` within a
    second (`web.shared`), if read after the event the page's script says it saw (`?seen=`,
    what made it refresh); the page then says the event id read before the shared read."""
    reads: SharedReads = request.app.state.shared_reads
    seen = request.query_params.get("seen", "0")
    value, since = await reads.read(
        key, request.state.events_since, compute, seen=int(seen) if seen.isdigit() else 0
    )
    request.state.events_since = min(request.state.events_since, since)
    return value


def acted(request: Request, where: str) -> Response:
    """After a dashboard action: back to `where`, read afresh (no shared read from before)."""
    reads: SharedReads = request.app.state.shared_reads
    reads.forget()
    return RedirectResponse(where, status_code=303)
