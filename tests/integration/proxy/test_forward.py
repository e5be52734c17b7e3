"""The proxy's forwarding against real local HTTP servers as replicas: bodies both ways,
streaming chunk by chunk, connection reuse, a dead replica skipped, a replica that closes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from corral.proxy.forward import ProxyApp
from corral.proxy.http_server import serve_http
from corral.proxy.table import RouteTable, TableEntry
from corral.testing.redis_server import free_port


class Replica(ThreadingHTTPServer):
    """A local HTTP/1.1 server counting the connections it accepted."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.release = threading.Event()  # lets /stream send its second chunk

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def get_request(self) -> tuple[socket.socket, object]:
        self.connections += 1
        return super().get_request()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Replica

    def _answer(self, status: int, body: bytes, *extra: tuple[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk, wait in ((b"data: first\n\n", False), (b"data: second\n\n", True)):
                if wait:
                    self.server.release.wait(30)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/close":
            self._answer(200, b"bye", ("Connection", "close"))
            self.close_connection = True
            return
        seen = {"path": self.path, "port": self.server.server_address[1]}
        self._answer(200, json.dumps(seen).encode(), ("X-Replica", "yes"))

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer(201, body, ("Content-Type", "application/octet-stream"))

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    """Two replicas serving in threads."""
    servers = [Replica(), Replica()]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
async def proxy(replicas: list[Replica]) -> AsyncIterator[tuple[httpx.AsyncClient, RouteTable]]:
    """The proxy app served as `corral proxy` serves it, on a free port; an HTTP client on it
    and its table."""
    table = RouteTable()
    table.replace(1, [TableEntry("d1", "web", [replicas[0].address])])
    app = ProxyApp(table)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    serving = asyncio.create_task(serve_http(app, sock))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        yield http, table
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    await app.aclose()
    sock.close()


async def test_bodies_headers_and_queries_pass_both_ways(
    proxy: tuple[httpx.AsyncClient, RouteTable], replicas: list[Replica]
) -> None:
    """A body with a length and a chunked one reach the replica whole (with `Expect:
    100-continue` too); the query and the answer's own headers pass; the rest of the path is
    the replica's path; a HEAD answer has no body."""
    http, _ = proxy
    got = await http.get("/web/a/b?x=1&y=%20")
    assert got.status_code == 200
    assert got.json()["path"] == "/a/b?x=1&y=%20"
    assert got.headers["x-replica"] == "yes"
    sized = await http.post("/web/upload", content=b"x" * 100_000)
    assert sized.status_code == 201 and sized.content == b"x" * 100_000

    async def pieces() -> AsyncIterator[bytes]:
        for piece in (b"one ", b"two ", b"three"):
            yield piece

    chunked = await http.post("/web/upload", content=pieces())
    assert chunked.status_code == 201 and chunked.content == b"one two three"
    # The replica's interim 100 Continue is skipped for its final answer.
    expecting = await http.post("/web/upload", content=b"abc", headers={"Expect": "100-continue"})
    assert expecting.status_code == 201 and expecting.content == b"abc"
    head = await http.head("/web/anything")
    assert head.status_code == 501 and head.content == b""  # the replica has no HEAD


async def test_a_chunked_answer_streams_chunk_by_chunk(
    proxy: tuple[httpx.AsyncClient, RouteTable], replicas: list[Replica]
) -> None:
    """The first event arrives while the replica still holds back the second."""
    http, _ = proxy
    async with http.stream("GET", "/web/stream") as answer:
        chunks = answer.aiter_raw()
        assert await anext(chunks) == b"data: first\n\n"
        replicas[0].release.set()
        assert b"".join([c async for c in chunks]) == b"data: second\n\n"


async def test_connections_to_a_replica_are_reused_and_a_closing_one_is_not(
    proxy: tuple[httpx.AsyncClient, RouteTable], replicas: list[Replica]
) -> None:
    """Sequential requests share one connection to the replica; an answer with
    `Connection: close` ends it, and the next request opens a fresh one."""
    http, _ = proxy
    for _ in range(10):
        assert (await http.get("/web/")).status_code == 200
    assert replicas[0].connections == 1
    assert (await http.get("/web/close")).text == "bye"
    for _ in range(3):
        assert (await http.get("/web/")).status_code == 200
    assert replicas[0].connections == 2


async def test_a_dead_replica_is_skipped_and_none_left_is_a_503(
    proxy: tuple[httpx.AsyncClient, RouteTable], replicas: list[Replica]
) -> None:
    """A replica that refuses connections is passed over for the next; when every one
    refuses, or the deployment is unknown, the answer is a 503 problem."""
    http, table = proxy
    dead = f"127.0.0.1:{free_port()}"
    table.replace(2, [TableEntry("d1", "web", [dead, replicas[1].address])])
    ports = {(await http.get("/web/")).json()["port"] for _ in range(6)}
    assert ports == {replicas[1].server_address[1]}
    table.replace(3, [TableEntry("d1", "web", [dead])])
    refused = await http.get("/web/")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    unknown = await http.get("/nothing/")
    assert unknown.status_code == 503 and unknown.json()["type"].endswith("/no-healthy-replica")
    metrics = (await http.get("/metrics")).text
    assert 'corral_proxy_requests_total{code="503",deployment="-"} 1.0' in metrics
    assert 'corral_proxy_requests_total{code="200",deployment="d1"} 6.0' in metrics


@pytest.fixture
def breaking() -> Iterator[str]:
    """A replica that accepts connections and resets them unanswered (a process killed as it
    was asked); its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def reset_all() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            connection.recv(65536)
            connection.close()

    thread = threading.Thread(target=reset_all, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


async def test_a_replica_breaking_before_answering_passes_a_get_on_but_not_a_post(
    proxy: tuple[httpx.AsyncClient, RouteTable], replicas: list[Replica], breaking: str
) -> None:
    """A GET the first replica reset unanswered is asked of the next; a POST, which that one
    may have acted on, is a 502 problem."""
    http, table = proxy
    table.replace(2, [TableEntry("d1", "web", [breaking, replicas[1].address])])
    for _ in range(4):
        got = await http.get("/web/")
        assert got.status_code == 200 and got.json()["port"] == replicas[1].server_address[1]
    statuses = {(await http.post("/web/upload", content=b"x")).status_code for _ in range(4)}
    assert statuses == {201, 502}  # round robin: half of them met the breaking replica first
