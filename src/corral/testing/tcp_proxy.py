"""A TCP proxy that can be cut and restored: a network outage on demand, for fault tests.

Put it in front of a server (PostgreSQL, a manager) and point the clients at it. `cut()` closes
every connection through it and refuses new ones at once (each is accepted and closed); `stall()`
keeps connections open but forwards nothing (a server that stopped answering); `restore()`
forwards again. The server itself is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging

logger = logging.getLogger(__name__)

_CHUNK = 65536


class ProxyState(enum.Enum):
    """What the proxy does with traffic."""

    FORWARDING = "forwarding"
    CUT = "cut"  # connections closed, new ones closed at once
    STALLED = "stalled"  # connections kept, nothing forwarded either way


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port` (start() before use)."""

    def __init__(
        self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self._port = port
        self.state = ProxyState.FORWARDING
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.connections = 0  # connections accepted so far (cut ones included)

    @property
    def port(self) -> int:
        """The port the proxy listens on (known after start())."""
        if self._server is None:
            raise RuntimeError("start() the proxy first")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> TcpProxy:
        """Listen; returns self."""
        self._server = await asyncio.start_server(self._accept, self.host, self._port)
        return self

    def cut(self) -> None:
        """Close every connection now and refuse new ones until restore()."""
        self.state = ProxyState.CUT
        self._flowing.set()  # stalled pipes wake and see the cut
        self._close_all()

    def stall(self) -> None:
        """Keep connections but forward nothing until restore() (a silent server)."""
        self.state = ProxyState.STALLED
        self._flowing.clear()

    def restore(self) -> None:
        """Forward again (connections closed by a cut stay closed; clients reconnect)."""
        self.state = ProxyState.FORWARDING
        self._flowing.set()

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        self._close_all()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _cut(self) -> bool:
        # A method, not an inline test: the state changes while a connection awaits.
        return self.state is ProxyState.CUT

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()  # a reset, as a dropped network path looks to a client
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.state is ProxyState.CUT:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            writer.transport.abort()
            return
        if self._cut():  # cut while connecting
            writer.transport.abort()
            upstream_writer.transport.abort()
            return
        self._writers.update((writer, upstream_writer))
        pipes = [
            asyncio.create_task(self._pipe(reader, upstream_writer)),
            asyncio.create_task(self._pipe(upstream_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            self._pipes.difference_update(pipes)
            for end in (writer, upstream_writer):
                self._writers.discard(end)
                end.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                await self._flowing.wait()
                if self._cut():
                    return
                writer.write(data)
                await writer.drain()
