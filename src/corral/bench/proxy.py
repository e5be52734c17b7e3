"""`corral bench proxy`: the serving proxy against a trivial replica, through it and direct, in
the same run: requests/s and latency percentiles at a number of concurrent connections.

The replica (uvicorn) and the proxy (its own server, as `corral proxy` runs it) are each a
process of their own; the load comes from this process, one keep-alive connection per
concurrent client.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from corral.domain.record import record

_REPLICA = """
import sys, uvicorn

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, lifespan="off")
"""

_PROXY = """
import asyncio, socket, sys
from corral.proxy.forward import ProxyApp
from corral.proxy.http_server import serve_http
from corral.proxy.table import RouteTable, TableEntry

table = RouteTable()
table.replace(1, [TableEntry("bench", "bench", [sys.argv[2]])])
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen(2048)
asyncio.run(serve_http(ProxyApp(table), sock))
"""

# How long the servers may take to listen.
START_DEADLINE_S = 30.0


@record
class Measured:
    """One target's figures."""

    requests: int
    errors: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float


def run_proxy_bench(concurrency: int = 64, duration_s: float = 5.0) -> dict[str, Any]:
    """Measure direct and through the proxy; the figures as JSON-ready values."""
    replica_port, proxy_port = _free_port(), _free_port()
    with (
        _process(_REPLICA, str(replica_port)),
        _process(_PROXY, str(proxy_port), f"127.0.0.1:{replica_port}"),
    ):
        _wait_listening(replica_port)
        _wait_listening(proxy_port)
        direct = asyncio.run(_load(replica_port, "/", concurrency, duration_s))
        proxied = asyncio.run(_load(proxy_port, "/bench/", concurrency, duration_s))
    return {
        "benchmark": "proxy",
        "concurrency": concurrency,
        "duration_s": duration_s,
        "direct": _as_json(direct),
        "proxy": _as_json(proxied),
        "added_p50_ms": round(proxied.p50_ms - direct.p50_ms, 2),
        "throughput_ratio": round(proxied.requests_per_s / direct.requests_per_s, 3)
        if direct.requests_per_s
        else None,
    }


async def _load(port: int, path: str, concurrency: int, duration_s: float) -> Measured:
    """`concurrency` keep-alive connections, each sending GET `path` again as soon as the
    answer came. Raw HTTP/1.1 on asyncio streams, so that the generator costs far less than
    the servers it loads (an httpx client saturated first: 143 req/s at 64 connections against
    a server that does thousands, benchmarks.md)."""
    request = f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n".encode()
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + duration_s

    async def client() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < end:
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = _content_length(head)
                if length is None:  # chunked
                    while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                        await reader.readexactly(size + 2)
                    await reader.readexactly(2)
                elif length:
                    await reader.readexactly(length)
                if head.startswith(b"HTTP/1.1 200"):
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    took = time.perf_counter() - started
    latencies.sort()
    return Measured(
        requests=len(latencies),
        errors=errors,
        requests_per_s=len(latencies) / took,
        p50_ms=_percentile(latencies, 0.50),
        p99_ms=_percentile(latencies, 0.99),
    )


def _content_length(head: bytes) -> int | None:
    """The answer's body length; None for a chunked one."""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            return int(value)
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return None
    return 0


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _as_json(measured: Measured) -> dict[str, Any]:
    return {
        "requests": measured.requests,
        "errors": measured.errors,
        "requests_per_s": round(measured.requests_per_s, 1),
        "p50_ms": round(measured.p50_ms, 2),
        "p99_ms": round(measured.p99_ms, 2),
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def _process(code: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", code, *args])
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"nothing listens on port {port} after {START_DEADLINE_S} s"
                ) from None
            time.sleep(0.05)
