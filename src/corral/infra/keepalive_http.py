"""A lean HTTP/1.1 client over kept-alive connections, for the calls corral's daemons make.

httpx spends about 0.8 ms of CPU on a request to a local server in a tight loop, and two to
three times that on a request after a pause, as an agent's heartbeat every ten seconds is: most
of an idle agent's CPU. `KeepAliveClient` writes the request itself and reads the answer with
asyncio streams (~0.05 ms). It is the agent's transport to its managers (`agent.client`) and
the load generator's (`bench._http`), which must measure the manager, not its client.

What it does: one server (http, or https with a given `ssl.SSLContext`, optionally verified as
another name than the URL's host: `server_hostname`); requests with a body of bytes, a query
and headers; answers with a Content-Length or a chunked body, read whole. Each request takes an
idle connection (or opens one), writes the request, reads the answer and gives the connection
back, unless the server closes it or anything failed. A kept-alive connection the server closed
while it sat idle is noticed when nothing of the answer comes back, and the request is sent
again on a new connection, as HTTP clients do; one idle longer than `keepalive_s` is closed
instead of reused. Every failure to get an answer (refused, cut, timed out, not HTTP) is
`HttpError`. No proxies (`corral._proxies`: callers use httpx where one is named), no
redirects, cookies or compression.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from corral.domain.record import record

__all__ = ["HttpError", "KeepAliveClient", "Reply", "httpx_reply"]

_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


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


def httpx_reply(response: Any) -> Reply:
    """An httpx response as a `Reply` (for callers that go over httpx where a proxy is named,
    and the bench's in-process tests): the same reading whatever the transport."""
    return Reply(
        response.status_code,
        response.reason_phrase,
        response.headers.get("content-type", ""),
        response.content,
    )


class KeepAliveClient:
    """Requests to the server at `base_url` on kept-alive connections (see the module)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        keepalive_s: float | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host:port, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self._ssl: ssl.SSLContext | None = None
        self._server_hostname = server_hostname
        if parts.scheme == "https":
            self._ssl = ssl_context or ssl.create_default_context()
        fixed = {"Host": server_hostname or parts.netloc, **(headers or {})}
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._clock = clock
        self._idle: list[tuple[_Connection, float]] = []  # with when each went idle

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
        query: str = "",
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """Send one request (`path` under the base URL, `query` already encoded) and read the
        whole answer; `HttpError` when none comes within `timeout_s` (default: the client's)."""
        target = f"{self.prefix}{path}?{query}" if query else f"{self.prefix}{path}"
        head = f"{method} {target} HTTP/1.1\r\n{self._headers}"
        for name, value in (headers or {}).items():
            head += f"{name}: {value}\r\n"
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        elif method in ("POST", "PUT", "PATCH"):
            head += "Content-Length: 0\r\n"
        message = (head + "\r\n").encode("latin-1") + (body or b"")
        deadline_s = self.timeout_s if timeout_s is None else timeout_s
        connection = self._idle_connection()
        if connection is not None:
            try:
                return await self._exchange(connection, message, deadline_s)
            except _StaleConnectionError:
                pass  # the server closed it while idle: the request goes on a new connection
        return await self._exchange(None, message, deadline_s)

    async def json(
        self,
        method: str,
        path: str,
        value: Any = None,
        *,
        query: str = "",
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """`request` with `value` sent as JSON (None: no body)."""
        body = None if value is None else json.dumps(value).encode()
        return await self.request(
            method, path, body=body, query=query, headers=headers, timeout_s=timeout_s
        )

    def _idle_connection(self) -> _Connection | None:
        now = self._clock()
        while self._idle:
            connection, since = self._idle.pop()
            expired = self.keepalive_s is not None and now - since > self.keepalive_s
            if not expired and not connection[0].at_eof():
                return connection
            _discard(connection)
        return None

    async def _open(self) -> _Connection:
        opening = asyncio.open_connection(
            self.host,
            self.port,
            ssl=self._ssl,
            server_hostname=self._server_hostname if self._ssl is not None else None,
        )
        if self.connect_timeout_s is None:
            return await opening
        try:
            return await asyncio.wait_for(opening, self.connect_timeout_s)
        except TimeoutError:
            raise HttpError(
                f"ConnectTimeout: {self.host}:{self.port} did not accept a connection "
                f"within {self.connect_timeout_s:g} s"
            ) from None

    async def _exchange(
        self, connection: _Connection | None, message: bytes, timeout_s: float
    ) -> Reply:
        """Send `message` on `connection` (None: a new one) and read the answer."""
        reused = connection is not None
        try:
            async with asyncio.timeout(timeout_s):
                if connection is None:
                    connection = await self._open()
                reader, writer = connection
                writer.write(message)
                reply, keep = await _read_reply(reader)
        except TimeoutError:
            _discard(connection)
            raise HttpError(f"ReadTimeout: no answer within {timeout_s:g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            _discard(connection)
            if reused and _nothing_read(exc):
                raise _StaleConnectionError from exc
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:  # cancelled mid-exchange: the connection is in an unknown state
            _discard(connection)
            raise
        if keep:
            self._idle.append((connection, self._clock()))
        else:
            _discard(connection)
        return reply

    async def close(self) -> None:
        """Close every idle connection (those in use close when their exchange ends)."""
        idle, self._idle = self._idle, []
        for (_, writer), _since in idle:
            writer.close()
        for (_, writer), _since in idle:
            with contextlib.suppress(OSError, ssl.SSLError):
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
    status = int(code)
    if status in (204, 304) or 100 <= status < 200:
        body = b""
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunks(reader)
    else:
        raise ValueError("the answer has neither Content-Length nor chunked encoding")
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


def _discard(connection: _Connection | None) -> None:
    if connection is not None:
        connection[1].close()
