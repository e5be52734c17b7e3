"""The load generator's HTTP: what it needs of a client, and a lean one over raw connections.

`corral bench api` must measure the manager, not its client. httpx spends about 4 ms of CPU
per request under 32 concurrent requests (measured: 217 requests/s against a FastAPI endpoint
that returns a constant, with the client's process at 100 % of a core and the server's at
20 %), so a load generator built on it cannot send the 1,000 creates/s the target asks for.
`KeepAliveClient` writes HTTP/1.1 requests on a few kept-alive connections and reads the
answers with asyncio streams: 0.14 ms of CPU per request, 2,230 requests/s against the same
endpoint, where the server became the limit.

`Http` is the one method the load generator calls; `HttpxClient` adapts an httpx client to it
(the tests drive the load generator in-process through httpx's ASGI transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from corral.domain.record import record


class HttpError(Exception):
    """A request got no answer: refused, cut, timed out, or an answer that is not HTTP."""


@record
class Reply:
    """An HTTP answer, read whole."""

    status: int
    reason: str
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (ValueError if it is not)."""
        return json.loads(self.body)


class Http(Protocol):
    """Sends one request and reads its whole answer; `HttpError` when there is none."""

    async def request(self, method: str, path: str, body: Any = None) -> Reply: ...


class HttpxClient:
    """`Http` over an httpx client (its base URL and headers apply)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(self, method: str, path: str, body: Any = None) -> Reply:
        try:
            response = await self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        return Reply(
            response.status_code,
            response.reason_phrase,
            response.headers.get("content-type", ""),
            response.content,
        )


class KeepAliveClient:
    """`Http` over HTTP/1.1 keep-alive connections to one server, opened as requests need them.

    Each request takes an idle connection (or opens one), writes the request, reads the answer
    (a Content-Length or chunked body) and gives the connection back, unless the server closes
    it or anything failed. A kept-alive connection the server closed while it sat idle (as
    uvicorn does after 5 s) is noticed when nothing of the answer comes back, and the request
    is sent again on a new connection, as HTTP clients do. `close()` closes every idle one.
    """

    def __init__(self, base_url: str, *, token: str, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base_url must be http://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = (
            f"Host: {parts.netloc}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n"
        )
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, body: Any = None) -> Reply:
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n{self._headers}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        message = (head + "\r\n").encode() + payload
        connection = self._idle_connection()
        if connection is not None:
            try:
                return await self._exchange(connection, message)
            except _StaleConnectionError:
                pass  # the server closed it while idle: the request goes on a new connection
        return await self._exchange(None, message)

    def _idle_connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection[0].at_eof():
                return connection
            _discard(connection)
        return None

    async def _exchange(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None, message: bytes
    ) -> Reply:
        """Send `message` on `connection` (None: a new one) and read the answer."""
        reused = connection is not None
        try:
            async with asyncio.timeout(self.timeout_s):
                if connection is None:
                    connection = await asyncio.open_connection(self.host, self.port)
                reader, writer = connection
                writer.write(message)
                reply, keep = await _read_reply(reader)
        except TimeoutError:
            _discard(connection)
            raise HttpError(f"ReadTimeout: no answer within {self.timeout_s:g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            _discard(connection)
            if reused and _nothing_read(exc):
                raise _StaleConnectionError from exc
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:  # cancelled mid-exchange: the connection is in an unknown state
            _discard(connection)
            raise
        if keep:
            self._idle.append(connection)
        else:
            _discard(connection)
        return reply

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class _StaleConnectionError(Exception):
    """A kept-alive connection the server had closed: nothing of an answer came back."""


def _nothing_read(error: Exception) -> bool:
    if isinstance(error, asyncio.IncompleteReadError):
        return not error.partial
    return isinstance(error, ConnectionResetError | BrokenPipeError)


async def _read_reply(reader: asyncio.StreamReader) -> tuple[Reply, bool]:
    """One answer from `reader`, and whether the connection may carry the next request."""
    head = await reader.readuntil(b"\r\n\r\n")  # LimitOverrunError past the reader's 64 KiB
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunks(reader)
    else:
        raise ValueError("the answer has neither Content-Length nor chunked encoding")
    status = int(code)
    keep = headers.get("connection", "").lower() != "close"
    if not reason:
        with contextlib.suppress(ValueError):
            reason = HTTPStatus(status).phrase
    return Reply(status, reason, headers.get("content-type", ""), body), keep


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields, unused
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _discard(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
    if connection is not None:
        connection[1].close()
