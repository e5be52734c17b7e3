"""The proxy's side towards the replicas: HTTP/1.1 over pooled keep-alive connections.

Lean on purpose (`corral bench proxy`): a request is one write of its head (and its body as it
comes), the answer's head one read, a body with a length one read (a large one in pieces),
and a chunked body is passed on chunk by chunk as each arrives, so a model's tokens are not
held back. A connection goes back to its replica's pool when its exchange ended cleanly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

# Hop-by-hop headers (RFC 9110, 7.6.1) are the connection's, not the message's; `host` and the
# body's framing are set anew for the next hop.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
# An answer's body longer than this is passed on in pieces of this size.
PIECE_BYTES = 64 * 1024
# The longest answer head read from a replica (status line and headers).
MAX_HEAD_BYTES = 64 * 1024
# Idle connections kept per replica.
MAX_IDLE_PER_REPLICA = 256

SendBody = Callable[[bytes, bool], Awaitable[None]]  # (chunk, more to come)


class ReplicaUnreachableError(ConnectionError):
    """No connection to the replica could be made: the request never reached it."""


class ReplicaFailedError(ConnectionError):
    """The replica broke the exchange (closed, or answered what is not HTTP/1.1)."""


class Answer:
    """A replica's answer: its status and headers; its body is read with `relay_body`."""

    __slots__ = ("_chunked", "_close", "_length", "headers", "status")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        length: int | None,
        chunked: bool,
        close: bool,
    ) -> None:
        self.status = status
        self.headers = headers  # hop-by-hop ones left out, content-length kept
        self._length = length
        self._chunked = chunked
        self._close = close


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class Upstream:
    """Keep-alive connections to the replicas, by address (host:port)."""

    def __init__(self, *, connect_timeout_s: float = 5.0, timeout_s: float = 300.0) -> None:
        self._idle: dict[str, collections.deque[_Connection]] = {}
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s  # a replica's silence longer than this fails the request

    async def aclose(self) -> None:
        """Close every idle connection."""
        for pool in self._idle.values():
            while pool:
                pool.pop().close()
        self._idle.clear()

    async def exchange(
        self,
        address: str,
        head: bytes,
        body: AsyncIterator[bytes] | None,
        send_start: Callable[[Answer], Awaitable[None]],
        send_body: SendBody,
        *,
        chunked: bool = False,
        no_body: bool = False,
    ) -> Answer:
        """Send the request (`head`, then `body` when given, chunked or as is) to the replica at
        `address`; pass its answer's head to `send_start` and its body to `send_body`.

        ReplicaUnreachableError when no connection could be made (nothing was sent);
        ReplicaFailedError when the replica broke the exchange before its answer's head (a
        reused connection it had closed is tried again once, fresh, if there is no body).
        `no_body`: the answer has no body whatever its headers say (a HEAD request).
        """
        reused = True
        connection = self._take(address)
        if connection is None:
            reused = False
            connection = await self._connect(address)
        try:
            async with asyncio.timeout(self._timeout_s) as deadline:
                try:
                    answer = await self._send_and_read_head(connection, head, body, chunked)
                except (ReplicaFailedError, OSError):
                    connection.close()
                    if not reused or body is not None:
                        raise
                    # The replica had closed the idle connection: once more on a fresh one.
                    connection = await self._connect(address)
                    answer = await self._send_and_read_head(connection, head, None, False)
                await send_start(answer)
                keep = await self._relay_body(connection, answer, send_body, deadline, no_body)
        except BaseException:
            connection.close()
            raise
        if keep:
            self._give_back(address, connection)
        else:
            connection.close()
        return answer

    def _take(self, address: str) -> _Connection | None:
        pool = self._idle.get(address)
        while pool:
            connection = pool.pop()
            if not connection.reader.at_eof() and not connection.writer.is_closing():
                return connection
            connection.close()  # the replica closed it while it was idle
        return None

    def _give_back(self, address: str, connection: _Connection) -> None:
        pool = self._idle.get(address)
        if pool is None:
            pool = self._idle[address] = collections.deque()
        if len(pool) < MAX_IDLE_PER_REPLICA:
            pool.append(connection)
        else:
            connection.close()

    async def _connect(self, address: str) -> _Connection:
        host, _, port = address.rpartition(":")
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    host.strip("[]"), int(port), limit=MAX_HEAD_BYTES
                )
        except (OSError, TimeoutError, ValueError) as exc:
            raise ReplicaUnreachableError(f"cannot connect to {address}: {exc}") from exc
        return _Connection(reader, writer)

    async def _send_and_read_head(
        self,
        connection: _Connection,
        head: bytes,
        body: AsyncIterator[bytes] | None,
        chunked: bool,
    ) -> Answer:
        writer = connection.writer
        writer.write(head)
        if body is not None:
            async for chunk in body:
                writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                await writer.drain()
            if chunked:
                writer.write(b"0\r\n\r\n")
        await writer.drain()
        while True:
            try:
                raw = await connection.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                raise ReplicaFailedError(
                    "the replica closed the connection before answering"
                ) from exc
            except asyncio.LimitOverrunError as exc:
                raise ReplicaFailedError(
                    f"the replica's answer head is over {MAX_HEAD_BYTES} bytes"
                ) from exc
            answer = _parse_head(raw)
            # An interim answer (100 Continue to a client's Expect) is the replica's to the
            # proxy, which sent the body already: the final answer follows.
            if not 100 <= answer.status < 200:
                return answer

    async def _relay_body(
        self,
        connection: _Connection,
        answer: Answer,
        send_body: SendBody,
        deadline: asyncio.Timeout,
        no_body: bool,
    ) -> bool:
        """Pass the answer's body on; whether the connection may be used again."""
        reader = connection.reader
        if no_body or answer.status in (204, 304):
            await send_body(b"", False)
            return not answer._close
        if answer._chunked:
            loop = asyncio.get_running_loop()
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers: not passed on
                    await send_body(b"", False)
                    return not answer._close
                chunk = await reader.readexactly(size + 2)
                await send_body(chunk[:-2], True)
                deadline.reschedule(loop.time() + self._timeout_s)
        if answer._length is not None:
            remaining = answer._length
            if remaining <= PIECE_BYTES:
                await send_body(await reader.readexactly(remaining) if remaining else b"", False)
                return not answer._close
            loop = asyncio.get_running_loop()
            while remaining:
                piece = await reader.readexactly(min(remaining, PIECE_BYTES))
                remaining -= len(piece)
                await send_body(piece, bool(remaining))
                deadline.reschedule(loop.time() + self._timeout_s)
            return not answer._close
        # No length, not chunked: the body ends with the connection.
        loop = asyncio.get_running_loop()
        while piece := await reader.read(PIECE_BYTES):
            await send_body(piece, True)
            deadline.reschedule(loop.time() + self._timeout_s)
        await send_body(b"", False)
        return False


def request_head(method: str, target: bytes, address: str, headers: list[bytes]) -> bytes:
    """An HTTP/1.1 request head: `headers` are complete `name: value\\r\\n` lines."""
    return b"%b %b HTTP/1.1\r\nhost: %b\r\n%b\r\n" % (
        method.encode("ascii"),
        target,
        address.encode("ascii"),
        b"".join(headers),
    )


def _parse_head(raw: bytes) -> Answer:
    lines = raw[:-4].split(b"\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ReplicaFailedError(f"the replica answered {status_line[:40]!r}, not HTTP/1.x")
    try:
        status = int(rest[:3])
    except ValueError:
        raise ReplicaFailedError(
            f"the replica answered a bad status line {status_line[:40]!r}"
        ) from None
    close = version == b"HTTP/1.0"
    length: int | None = None
    chunked = False
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        value = value.strip()
        if name == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value)
            headers.append((name, value))
        elif name == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif name == b"connection":
            tokens = value.lower()
            if b"close" in tokens:
                close = True
            elif b"keep-alive" in tokens:
                close = False
        elif name not in HOP_BY_HOP:
            headers.append((name, value))
    if chunked:
        length = None
        headers = [(n, v) for n, v in headers if n != b"content-length"]
    return Answer(status, headers, length, chunked, close)
