"""uvicorn's server with a quiet idle loop.

uvicorn's `Server.main_loop` wakes ten times a second to see whether it should exit (and once a
second of those to renew the Date header): an idle manager's most frequent wake-up. This one
renews the Date header once a second, as uvicorn does, and wakes at once when `should_exit` is
set (from any thread, or a signal handler) instead of polling for it.
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

# uvicorn renews its Date header on every tenth 0.1 s tick: on each of ours.
_TICKS_PER_SECOND = 10
TICK_S = 1.0


class QuietServer(uvicorn.Server):
    """A uvicorn server whose main loop wakes once a second, or when asked to exit."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._should_exit = False
        super().__init__(config)

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

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._exit_asked = asyncio.Event()
        if self._should_exit:
            self._exit_asked.set()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + _TICKS_PER_SECOND) % 864000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._exit_asked.wait()
            should_exit = await self.on_tick(counter)
