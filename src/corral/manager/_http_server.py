"""uvicorn's server without an idle loop.

uvicorn's `Server.main_loop` wakes ten times a second to see whether it should exit, and on
every tenth of those renews the Date header its answers carry: an idle manager's most frequent
wake-up. This one never ticks: the Date header is made when an answer asks for it (once a
second at most, the text uvicorn's tick makes), and the loop wakes only when `should_exit` is
set (from any thread, or a signal handler) instead of polling for it. Nor does it take SIGINT
and SIGTERM for itself, as uvicorn's `serve` does (`capture_signals`): the daemons do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from email.utils import formatdate

import uvicorn
from uvicorn.server import ServerState

wall_clock = time.time  # the Date header's clock (tests replace it)


class _DatedState(ServerState):
    """uvicorn's shared server state whose default headers carry the current Date, made on
    read: each request's answer reads them (as `on_tick` would have left them)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._config = config
        self._second: int | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        super().__init__()

    @property  # uvicorn has a plain attribute, written by its tick
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        now = int(wall_clock())
        if now != self._second:
            date = formatdate(now, usegmt=True).encode()
            dated = [(b"date", date)] if self._config.date_header else []
            self._headers = dated + self._config.encoded_headers
            self._second = now
        return self._headers

    @default_headers.setter
    def default_headers(self, _value: list[tuple[bytes, bytes]]) -> None:
        """uvicorn's own writes (at start, and its tick's) are ignored: the read makes them."""


class QuietServer(uvicorn.Server):
    """A uvicorn server whose main loop sleeps until it is asked to exit."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._should_exit = False
        super().__init__(config)
        self.server_state = _DatedState(config)

    @property  # uvicorn has a plain attribute: the setter keeps its meaning
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._exit_asked is not None and self._loop is not None:
            # Thread-safe, and it wakes the loop's selector (a signal handler runs between
            # bytecodes, while the loop may be blocked in its poll).
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing waits
                self._loop.call_soon_threadsafe(self._exit_asked.set)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Off: uvicorn would take SIGINT and SIGTERM for itself and stop serving at once.
        `corral manager` and `corral up` handle them and stop in their own order: `corral up`'s
        agents first, whose last reports (the kernels they stopped) must still reach the API."""
        yield

    async def main_loop(self) -> None:
        """uvicorn's loop, which ends when `on_tick` says to exit: here, once it is asked to
        (corral sets no request limit and no notify callback, the tick's other work)."""
        self._loop = asyncio.get_running_loop()
        self._exit_asked = asyncio.Event()
        if self._should_exit:
            self._exit_asked.set()
        while not await self.on_tick(0):
            await self._exit_asked.wait()
