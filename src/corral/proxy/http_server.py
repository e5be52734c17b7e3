"""The proxy's side towards its clients: a small HTTP/1.1 server for one ASGI app.

Why not uvicorn, which serves the manager: behind it the proxy kept a third of direct
throughput at 64 connections (`docs/benchmarks.md`): its HTTP parsing cost about what a whole
replica spends on a request, and it writes an answer's head and body in two sends. This one
parses only what a proxy needs, writes an answer's head with its first bytes, and keeps
HTTP/1.1's rules that matter at the edge: a request with both a length and chunked framing,
a bad length, or a head over `MAX_HEAD_BYTES` is refused (no request smuggling past it);
requests on a connection are answered in order; an idle connection is closed after
`KEEP_ALIVE_S`; `Expect: 100-continue` is answered when the app first reads the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)

App = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]

MAX_HEAD_BYTES = 64 * 1024
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110, 5.6.2)
MAX_HEADERS = 128
KEEP_ALIVE_S = 5.0  # an idle connection is closed after this long (uvicorn's default)
_READ_HIGH_BYTES = 256 * 1024  # a request body buffered beyond this pauses reading
_REASONS = {
    100: b"Continue",
    200: b"OK",
    201: b"Created",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    409: b"Conflict",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


class ClientGoneError(ConnectionError):
    """The client closed the connection: the answer has nowhere to go (the app stops)."""


class _BadRequestError(ValueError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class _Request:
    """One parsed request head, and its body's framing."""

    __slots__ = (
        "chunked",
        "close",
        "expect_continue",
        "headers",
        "http10",
        "length",
        "method",
        "path",
    )

    def __init__(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise _BadRequestError(400, "not an HTTP/1.x request line")
        method, self.path, version = parts
        if not self.path.startswith(b"/") or not method.isalpha():
            raise _BadRequestError(400, "only origin-form requests are served")
        self.method = method.decode("ascii")
        if len(lines) - 1 > MAX_HEADERS:
            raise _BadRequestError(431, "too many headers")
        self.http10 = version == b"HTTP/1.0"
        self.close = self.http10
        self.length: int | None = None
        self.chunked = False
        self.expect_continue = False
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                raise _BadRequestError(400, "a malformed header line")
            name = name.lower()
            value = value.strip()
            if name == b"content-length":
                if self.length is not None or not value.isdigit():
                    raise _BadRequestError(400, "a bad or repeated Content-Length")
                self.length = int(value)
            elif name == b"transfer-encoding":
                if value.lower() != b"chunked" or self.chunked:
                    raise _BadRequestError(400, "only one Transfer-Encoding: chunked is served")
                self.chunked = True
            elif name == b"connection":
                tokens = value.lower()
                if b"close" in tokens:
                    self.close = True
                elif b"keep-alive" in tokens:
                    self.close = False
            elif name == b"expect" and value.lower() == b"100-continue":
                self.expect_continue = True
            headers.append((name, value))
        if self.chunked and self.length is not None:
            raise _BadRequestError(400, "both Content-Length and Transfer-Encoding")
        self.headers = headers


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as bytes come, answered one at a time."""

    def __init__(self, app: App, connections: set[_Connection]) -> None:
        self._app = app
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._data = asyncio.Event()  # new bytes, or the connection ended
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = False
        self._reading_paused = False
        self._idle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle_since = 0.0  # loop.time() when the connection last became idle
        self._busy = False  # a request is being answered
        self._chunk_left = 0  # bytes of the current request body chunk still to come
        self._chunk_crlf = False  # the CRLF after a chunk's bytes is still to come

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(self)
        self._task = self._loop.create_task(self._serve())
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._data.set()
        if len(self._buffer) > _READ_HIGH_BYTES and not self._reading_paused:
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool | None:
        self._lost = True
        self._data.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._data.set()
        self._writable.set()
        self._connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- serving --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (the request in progress, if any, is cut)."""
        if self._transport is not None:
            self._transport.close()
        if self._task is not None:
            self._task.cancel()

    def _arm_idle(self) -> None:
        # One timer per connection, moved on lazily: re-arming it per request (a cancel and a
        # call_at) cost about 8 % of the proxy's time at 64 connections.
        self._idle_since = self._loop.time()
        self._busy = False
        if self._idle is None:
            self._idle = self._loop.call_at(self._idle_since + KEEP_ALIVE_S, self._idle_out)

    def _idle_out(self) -> None:
        self._idle = None
        if self._lost or self._transport is None:
            return
        due = self._idle_since + KEEP_ALIVE_S
        if self._busy or self._loop.time() < due:
            self._idle = self._loop.call_at(
                due if not self._busy else self._loop.time() + KEEP_ALIVE_S, self._idle_out
            )
            return
        self._transport.close()

    async def _wait_data(self) -> bool:
        """Wait for more bytes; False once the connection ended."""
        if self._lost:
            return False
        self._data.clear()
        if self._reading_paused:  # waiting for bytes: whatever is buffered is not enough
            assert self._transport is not None
            self._transport.resume_reading()
            self._reading_paused = False
        await self._data.wait()
        return True

    async def _serve(self) -> None:
        assert self._transport is not None
        try:
            while True:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_HEAD_BYTES:
                        raise _BadRequestError(431, "the request head is too long")
                    if not await self._wait_data():
                        return
                    continue
                self._busy = True  # a request's run is not idle, however long it takes
                request = _Request(bytes(self._buffer[:end]))
                del self._buffer[: end + 4]
                keep = await self._answer(request)
                if not keep or self._lost:
                    break
                self._arm_idle()
        except _BadRequestError as exc:
            if not self._lost:
                body = str(exc).encode()
                self._transport.write(
                    b"HTTP/1.1 %d %b\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n\r\n%b"
                    % (exc.status, _REASONS.get(exc.status, b""), len(body), body)
                )
        except ClientGoneError:
            pass
        except Exception:
            logger.exception("proxy.request_failed")
        finally:
            self._transport.close()

    async def _answer(self, request: _Request) -> bool:
        """Run the app for `request`; whether the connection may serve the next one."""
        assert self._transport is not None
        transport = self._transport
        self._chunk_left, self._chunk_crlf = 0, False
        path, _, query = request.path.partition(b"?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": path.decode("latin-1"),
            "raw_path": path,
            "query_string": query,
            "headers": request.headers,
            "server": transport.get_extra_info("sockname"),
            "client": transport.get_extra_info("peername"),
        }
        body_left = request.length or 0
        chunked = request.chunked
        body_done = not chunked and body_left == 0
        head_sent = False
        ended = False
        head_only = request.method == "HEAD"
        pending_head: bytes | None = None
        framing_chunked = False
        continue_owed = request.expect_continue

        async def receive() -> dict[str, Any]:
            nonlocal body_left, body_done, continue_owed
            if body_done:
                if self._lost:
                    return {"type": "http.disconnect"}
                return {"type": "http.request", "body": b"", "more_body": False}
            if continue_owed:
                continue_owed = False
                transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            if chunked:
                chunk = await self._read_chunk()
                if chunk is None:
                    return {"type": "http.disconnect"}
                if not chunk:
                    body_done = True
                return {"type": "http.request", "body": chunk, "more_body": not body_done}
            while not self._buffer:
                if not await self._wait_data():
                    return {"type": "http.disconnect"}
            piece = bytes(self._buffer[:body_left])
            del self._buffer[: len(piece)]
            body_left -= len(piece)
            body_done = body_left == 0
            return {"type": "http.request", "body": piece, "more_body": not body_done}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal head_sent, ended, pending_head, framing_chunked
            if self._lost:
                # Stop the app: a replica streaming to nobody would generate on for nothing.
                raise ClientGoneError("the client closed the connection")
            if ended:
                return
            if message["type"] == "http.response.start":
                status = message["status"]
                lines = [b"HTTP/1.1 %d %b\r\n" % (status, _REASONS.get(status, b""))]
                has_length = False
                for name, value in message.get("headers", ()):
                    lines.append(b"%b: %b\r\n" % (name, value))
                    has_length = has_length or name.lower() == b"content-length"
                if request.close:
                    lines.append(b"connection: close\r\n")
                # HTTP/1.0 knows no chunks: its answer ends with the connection.
                framing_chunked = (
                    not has_length
                    and not head_only
                    and not request.http10
                    and status not in (204, 304)
                )
                pending_head = b"".join(lines)
                return
            chunk: bytes = message.get("body", b"")
            more: bool = message.get("more_body", False)
            out = b""
            if pending_head is not None:
                head = pending_head
                pending_head = None
                head_sent = True
                if framing_chunked and not more:
                    # The whole body in one message: its length, not chunks.
                    framing_chunked = False
                    head += b"content-length: %d\r\n" % len(chunk)
                elif framing_chunked:
                    head += b"transfer-encoding: chunked\r\n"
                out = head + b"\r\n"
            if head_only:
                chunk = b""
            if framing_chunked:
                if chunk:
                    out += b"%x\r\n%b\r\n" % (len(chunk), chunk)
                if not more:
                    out += b"0\r\n\r\n"
            else:
                out += chunk
            if out:
                transport.write(out)
            if not more:
                ended = True
            elif not self._writable.is_set():
                await self._writable.wait()

        await self._app(scope, receive, send)
        if not head_sent:
            transport.write(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close"
                b"\r\n\r\n"
            )
            return False
        # An answer cut short, or a body the app did not read (a refused upload: the next
        # request would start inside it), ends the connection.
        return ended and body_done and not request.close

    async def _read_chunk(self) -> bytes | None:
        """The next piece of a chunked body, as it comes (b"" at its end); None if the
        connection ended."""
        while True:
            if self._chunk_left:
                if self._buffer:
                    size = min(self._chunk_left, len(self._buffer))
                    piece = bytes(self._buffer[:size])
                    del self._buffer[:size]
                    self._chunk_left -= size
                    self._chunk_crlf = not self._chunk_left
                    return piece
            elif self._chunk_crlf:
                if len(self._buffer) >= 2:
                    if self._buffer[:2] != b"\r\n":
                        raise _BadRequestError(400, "a chunk not ended by CRLF")
                    del self._buffer[:2]
                    self._chunk_crlf = False
                    continue
            else:
                line_end = self._buffer.find(b"\r\n")
                if line_end >= 0:
                    size_text = bytes(self._buffer[:line_end]).split(b";", 1)[0].strip()
                    try:
                        size = int(size_text, 16)
                    except ValueError:
                        raise _BadRequestError(400, "a bad chunk size") from None
                    if size:
                        del self._buffer[: line_end + 2]
                        self._chunk_left = size
                        continue
                    # The last chunk, then trailers (dropped) up to an empty line.
                    trailers_end = self._buffer.find(b"\r\n\r\n", line_end)
                    if trailers_end >= 0:
                        del self._buffer[: trailers_end + 4]
                        return b""
                elif len(self._buffer) > MAX_HEAD_BYTES:
                    raise _BadRequestError(400, "a bad chunk size line")
            if not await self._wait_data():
                return None


async def serve_http(app: App, sock: Any, *, ready: Callable[[], None] | None = None) -> None:
    """Serve `app` on the listening socket `sock` until cancelled; open connections are
    closed then."""
    connections: set[_Connection] = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(app, connections), sock=sock)
    if ready is not None:
        ready()
    try:
        await server.serve_forever()
    finally:
        server.close()
        for connection in list(connections):
            connection.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
