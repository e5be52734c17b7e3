"""The manager's HTTP server: it idles without polling, still dates its answers, and stops as
soon as it is asked to, from a thread or a signal handler, not at its next tick."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import httpx
import pytest
import uvicorn

from corral.manager import _http_server
from corral.manager._http_server import QuietServer


async def _hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


async def test_it_answers_with_a_date_and_stops_when_asked_from_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each answer carries the Date of its second (the clock is the test's), the server never
    ticks meanwhile, and a plain write of `should_exit` from a thread ends it at once."""
    now = [1_700_000_000.0]
    monkeypatch.setattr(_http_server, "wall_clock", lambda: now[0])
    ticks: list[int] = []
    real_tick = QuietServer.on_tick

    async def counted(self: QuietServer, counter: int) -> bool:
        ticks.append(counter)
        return await real_tick(self, counter)

    monkeypatch.setattr(QuietServer, "on_tick", counted)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_hello, log_level="warning", lifespan="off", access_log=False)
    server = QuietServer(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(200):  # until it listens: polled, with a bound
                try:
                    reply = await client.get(f"http://127.0.0.1:{port}/")
                    break
                except httpx.ConnectError:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("the server never answered")
            assert reply.text == "hello"
            assert reply.headers["date"] == "Tue, 14 Nov 2023 22:13:20 GMT"
            now[0] += 61.5
            later = await client.get(f"http://127.0.0.1:{port}/")
            assert later.headers["date"] == "Tue, 14 Nov 2023 22:14:21 GMT"
        assert ticks == [0]  # once at start: no tick while it served
        # As a signal handler or another thread would: a plain attribute write.
        asker = threading.Thread(target=setattr, args=(server, "should_exit", True))
        asker.start()
        asker.join()
        await asyncio.wait_for(serving, timeout=30)  # not after its 3,600 s tick
    finally:
        serving.cancel()
        sock.close()
