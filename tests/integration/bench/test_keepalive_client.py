"""The bench's lean HTTP client against a real socket server that answers as scripted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from corral.bench._http import HttpError, KeepAliveClient

Answer = Callable[[bytes], bytes | None]  # the request's head → the raw answer (None: hang up)


@asynccontextmanager
async def server(answer: Answer) -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A server on a free port; yields its URL, the request heads it read, connection count."""
    heads: list[bytes] = []
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                heads.append(head + await reader.readexactly(length))
                raw = answer(head)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", heads, connections
    finally:
        listener.close()
        await listener.wait_closed()


def json_answer(_head: bytes) -> bytes:
    return (
        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
        b'content-length: 11\r\n\r\n{"id":"a1"}'
    )


async def test_requests_share_a_kept_alive_connection_and_carry_the_token() -> None:
    async with server(json_answer) as (url, heads, connections):
        client = KeepAliveClient(url, token="s3cret", timeout_s=5)
        try:
            for _ in range(3):
                reply = await client.request("POST", "/v1/sessions", {"cpu": 1})
                assert (reply.status, reply.reason, reply.json()) == (201, "Created", {"id": "a1"})
        finally:
            await client.close()
    assert len(connections) == 1
    assert len(heads) == 3
    first = heads[0].decode()
    assert first.startswith("POST /v1/sessions HTTP/1.1\r\n")
    assert "Authorization: Bearer s3cret\r\n" in first
    assert first.endswith('\r\n\r\n{"cpu": 1}')


async def test_a_chunked_answer_is_read_whole_and_a_closing_server_gets_a_new_connection() -> None:
    def chunked_then_close(_head: bytes) -> bytes:
        return (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            b'4\r\n{"a"\r\n3\r\n: 1\r\n1;ext=1\r\n}\r\n0\r\nx-trailer: 1\r\n\r\n'
        )

    async with server(chunked_then_close) as (url, _heads, connections):
        client = KeepAliveClient(url, token="t", timeout_s=5)
        try:
            for _ in range(2):
                reply = await client.request("GET", "/v1/sessions/a1")
                assert reply.json() == {"a": 1}
        finally:
            await client.close()
    assert len(connections) == 2


async def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error() -> None:
    answered = 0

    def answer_once_per_connection(head: bytes) -> bytes | None:
        nonlocal answered
        answered += 1
        return json_answer(head) if answered % 2 == 1 else None  # then hang up, as if idle

    async with server(answer_once_per_connection) as (url, heads, connections):
        client = KeepAliveClient(url, token="t", timeout_s=5)
        try:
            for _ in range(2):
                reply = await client.request("GET", "/v1/sessions/a1")
                assert reply.json() == {"id": "a1"}
        finally:
            await client.close()
    assert len(connections) == 2
    assert len(heads) == 3  # the second request went twice: on the closed, then a new one


async def test_no_answer_is_an_http_error_naming_what_happened() -> None:
    async with server(lambda _head: None) as (url, _heads, _connections):
        client = KeepAliveClient(url, token="t", timeout_s=5)
        with pytest.raises(HttpError, match="IncompleteReadError"):
            await client.request("GET", "/v1/sessions/a1")

    hang = asyncio.Event()

    async def never(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hang.wait()
        writer.close()

    listener = await asyncio.start_server(never, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        client = KeepAliveClient(f"http://127.0.0.1:{port}", token="t", timeout_s=0.05)
        with pytest.raises(HttpError, match=r"ReadTimeout: no answer within 0.05 s"):
            await client.request("GET", "/v1/sessions/a1")
    finally:
        hang.set()
        listener.close()
        await listener.wait_closed()


async def test_an_answer_that_is_not_http_is_refused() -> None:
    async with server(lambda _head: b"SSH-2.0-OpenSSH\r\n\r\n") as (url, _heads, _connections):
        client = KeepAliveClient(url, token="t", timeout_s=5)
        with pytest.raises(HttpError, match=r"not an HTTP/1\.x answer"):
            await client.request("GET", "/")


def test_only_plain_http_urls_are_accepted() -> None:
    with pytest.raises(ValueError, match="base_url"):
        KeepAliveClient("https://manager:8443", token="t", timeout_s=1)
