"""The proxy's HTTP/1.1 server on a real socket, spoken to byte by byte: framing it refuses,
requests answered in order, bodies read as they come, answers framed as the app sends them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from corral.proxy import http_server
from corral.proxy.http_server import serve_http


async def _echo(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    """Answers the method, path, query and body it got; `/stream` answers in two pieces."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    said = b"%b %b?%b %b" % (
        scope["method"].encode(),
        scope["raw_path"],
        scope["query_string"],
        body,
    )
    if scope["raw_path"] == b"/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await send({"type": "http.response.body", "body": b"two", "more_body": False})
        return
    headers = [(b"content-length", b"%d" % len(said))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": said})


@pytest.fixture
async def address() -> AsyncIterator[tuple[str, int]]:
    """The server with the echo app, on a free port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    serving = asyncio.create_task(serve_http(_echo, sock))
    yield sock.getsockname()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    sock.close()


async def _exchange(address: tuple[str, int], raw: bytes) -> bytes:
    """Send `raw`, then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order_with_their_bodies(
    address: tuple[str, int],
) -> None:
    """Three requests in one write (a sized body, a chunked one split oddly, and a closing
    one) are each answered, in order; `Connection: close` ends the connection after its."""
    raw = (
        b"POST /a?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
        b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: x\r\n\r\n"
        b"GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
    )
    answer = await _exchange(address, raw)
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    first, second, third = answer.split(b"HTTP/1.1 200 OK")[1:]
    assert first.endswith(b"\r\n\r\nPOST /a?x=1 hello")
    assert second.endswith(b"\r\n\r\nPOST /b? abcde")
    assert b"connection: close" in third and third.endswith(b"GET /c? ")


async def test_an_answer_in_pieces_is_chunked_and_a_whole_one_has_its_length(
    address: tuple[str, int],
) -> None:
    """An app's answer without a length is sent chunked when it comes in pieces (to HTTP/1.0,
    as it is, ended by the close); HEAD gets the head only."""
    streamed = await _exchange(address, b"GET /stream HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert b"transfer-encoding: chunked" in streamed
    assert streamed.endswith(b"\r\n\r\n3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n")
    old = await _exchange(address, b"GET /stream HTTP/1.0\r\n\r\n")  # knows no chunks
    assert b"transfer-encoding" not in old and old.endswith(b"\r\n\r\nonetwo")
    head = await _exchange(address, b"HEAD /x HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        # Both framings: a front and a back that disagree on where it ends smuggle requests.
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        (b"GET http://elsewhere/ HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: " + b"y" * (http_server.MAX_HEAD_BYTES + 10), 431),
    ],
)
async def test_ambiguous_or_bad_requests_are_refused_and_the_connection_closed(
    address: tuple[str, int], raw: bytes, status: int
) -> None:
    """Framing the proxy could read otherwise than a replica does is refused, then closed."""
    answer = await _exchange(address, raw)
    assert answer.startswith(b"HTTP/1.1 %d " % status)
    assert b"connection: close" in answer


async def test_an_idle_connection_is_closed(
    address: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the keep-alive time without a whole request (a half-sent head counts as idle),
    after one answered, the server closes the connection."""
    monkeypatch.setattr(http_server, "KEEP_ALIVE_S", 0.2)
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(b"GET /once HTTP/1.1\r\n\r\nGET /half")  # the second never finished
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await asyncio.wait_for(reader.read(), timeout=10) == b"GET /once? "
    finally:
        writer.close()
