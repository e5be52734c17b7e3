"""Open dashboards against a simulating manager (`corral simulate --dashboards N`).

The manager's API app, with the dashboard, is served over TCP from the simulation's own event
loop, so what the dashboards cost is taken from the manager's lifecycle work exactly as on a
real manager. The dashboards are clients in a process of their own (as browsers on other
machines would be): each signs in through the sign-in form, opens the live stream of its page
(`/ui/stream`) and fetches its page again when an event arrives, as the page's script
(`static/corral.js`) does: at most once a second, and at most every 20 x (open dashboards) x
the last fetch's duration.

Run as `python -m corral.bench.dashboard_load URL N` with an admin's token in
`CORRAL_BENCH_TOKEN`: it prints `ready` once its N streams are open; given `until ID` on its
stdin, it waits (boundedly) until every stream has shown the event ID, then prints its counts
as one JSON line. The stream writes frames in batches (`web.live.BATCH_S`), so a run shorter
than a batch would otherwise end before its dashboards saw anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import sqlalchemy as sa
import uvicorn

from corral.api.app import ApiContext, create_app
from corral.controller.agents import AgentController
from corral.controller.sessions import SessionController
from corral.domain.types import utcnow
from corral.infra.events import EventBus
from corral.store.database import Database
from corral.store.tables import events as events_table
from corral.store.users import create_user, issue_token
from corral.web._render import DASHBOARDS_HEADER

# What the dashboards look at, round robin: the pages an operator leaves open.
PAGES = ("/ui", "/ui/queue", "/ui/sessions", "/ui/agents", "/ui/events")
REFRESH_GAP_S = 1.0  # corral.js's REFRESH_GAP_MS
REFRESH_COST_FACTOR = 20  # corral.js's REFRESH_COST_FACTOR
READY_WAIT_S = 60.0
PAGE_TIMEOUT_S = 120.0  # a page fetch on a busy manager (a browser waits as long)
TOKEN_ENV = "CORRAL_BENCH_TOKEN"  # not on the command line, where `ps` would show it


@dataclass
class DashboardCounts:
    """What the open dashboards did, as the simulation reports it."""

    dashboards: int
    events: int = 0
    refreshes: int = 0
    refresh_ms_p50: float | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "dashboards": self.dashboards,
            "dashboard_events": self.events,
            "dashboard_refreshes": self.refreshes,
            "dashboard_refresh_p50_ms": self.refresh_ms_p50,
        }


@contextlib.asynccontextmanager
async def open_dashboards(
    db: Database,
    agents: AgentController,
    sessions: SessionController,
    events: EventBus,
    count: int,
    counts: DashboardCounts,
) -> AsyncIterator[None]:
    """Serve the manager's API app on 127.0.0.1 and keep `count` dashboards open on it until
    the block ends; `counts` is filled in then."""
    app = create_app(ApiContext(db=db, agents=agents, sessions=sessions, events=events))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    )
    serving = asyncio.create_task(server.serve(sockets=[listener]), name="sim-dashboard-api")
    clients: asyncio.subprocess.Process | None = None
    try:
        now = utcnow()
        admin = await create_user(db, "sim-dashboards", "admin", now)
        token = (await issue_token(db, admin, "dashboards", now)).secret
        clients = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "corral.bench.dashboard_load",
            f"http://127.0.0.1:{port}",
            str(count),
            env={**os.environ, TOKEN_ENV: token},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert clients.stdout is not None
        line = await asyncio.wait_for(clients.stdout.readline(), READY_WAIT_S)
        if line.strip() != b"ready":
            raise RuntimeError(f"the dashboards did not open: {line!r}")
        yield
    finally:
        if clients is not None:
            assert clients.stdin is not None and clients.stdout is not None
            async with db.read() as conn:
                last = await conn.scalar(sa.select(sa.func.max(events_table.c.id)))
            with contextlib.suppress(ConnectionError):
                clients.stdin.write(f"until {last or 0}\n".encode())
                await clients.stdin.drain()
            clients.stdin.close()
            with contextlib.suppress(TimeoutError):
                said = await asyncio.wait_for(clients.stdout.read(), READY_WAIT_S)
                found = json.loads(said or b"{}")
                counts.events = int(found.get("events", 0))
                counts.refreshes = int(found.get("refreshes", 0))
                counts.refresh_ms_p50 = found.get("refresh_ms_p50")
            if clients.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    clients.kill()
            await clients.wait()
        server.should_exit = True
        server.force_exit = True  # the streams stay open otherwise
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(serving), 10)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        listener.close()


class _Dashboard:
    """One open page: its stream, and a refresh of the page after events (corral.js's policy)."""

    def __init__(self, http: httpx.AsyncClient, page: str) -> None:
        self.http = http
        self.page = page
        self.events = 0
        self.last_id = 0  # the newest event id its stream showed
        self._progress = asyncio.Event()  # set when `last_id` moves
        self.took_ms: list[float] = []
        self._gap_s = REFRESH_GAP_S
        self._last = 0.0
        self._wanted = asyncio.Event()

    async def open(self, token: str) -> None:
        """Sign in through the form and load the page once."""
        answer = await self.http.post("/ui/sign-in", data={"token": token})
        if answer.status_code != 303:
            raise RuntimeError(f"signing in answered {answer.status_code}")
        await self._fetch()

    async def stream(self, opened: asyncio.Event) -> None:
        """Follow the live stream; each event asks for a refresh."""
        async with self.http.stream("GET", "/ui/stream", timeout=None) as answer:
            if answer.status_code != 200:
                raise RuntimeError(f"the stream answered {answer.status_code}")
            # Raw chunks, frames counted by their `data:` lines: the clients' own CPU, on the
            # manager's machine here, is kept small (a browser's would be elsewhere).
            async for chunk in answer.aiter_raw():
                # Open once its first frame (`: connected`) came: the manager subscribes to the
                # bus after the answer's head, so events between the two would be missed (a
                # short run could end before the dashboards saw any).
                opened.set()
                frames = chunk.count(b"data:")
                if frames:
                    self.events += frames
                    ids = _EVENT_ID.findall(chunk)
                    if ids:
                        self.last_id = max(self.last_id, int(ids[-1]))
                        self._progress.set()
                    self._wanted.set()

    async def reach(self, event_id: int) -> None:
        """Return once the stream has shown event `event_id` (or a later one)."""
        while self.last_id < event_id:
            self._progress.clear()
            await self._progress.wait()

    async def refresh(self) -> None:
        """Fetch the page again when asked, no sooner than the gap allows."""
        while True:
            await self._wanted.wait()
            await asyncio.sleep(max(0.0, self._last + self._gap_s - time.monotonic()))
            self._wanted.clear()
            await self._fetch()

    async def _fetch(self) -> None:
        self._last = time.monotonic()
        # As corral.js asks: data read after the newest event its stream brought.
        answer = await self.http.get(self.page, params={"seen": self.last_id})
        took_s = time.monotonic() - self._last
        if answer.status_code != 200:
            raise RuntimeError(f"{self.page} answered {answer.status_code}")
        self.took_ms.append(took_s * 1000)
        open_now = max(1, int(answer.headers.get(DASHBOARDS_HEADER, "1") or 1))
        self._gap_s = max(REFRESH_GAP_S, REFRESH_COST_FACTOR * open_now * took_s)


async def _run_clients(url: str, token: str, count: int) -> None:
    limits = httpx.Limits(max_connections=4)
    clients = [
        httpx.AsyncClient(base_url=url, limits=limits, timeout=PAGE_TIMEOUT_S) for _ in range(count)
    ]
    boards = [_Dashboard(c, PAGES[i % len(PAGES)]) for i, c in enumerate(clients)]
    tasks: list[asyncio.Task[None]] = []
    try:
        for board in boards:
            await board.open(token)
        for board in boards:
            opened = asyncio.Event()
            tasks.append(asyncio.create_task(board.stream(opened)))
            tasks.append(asyncio.create_task(board.refresh()))
            await asyncio.wait_for(opened.wait(), READY_WAIT_S)
        print("ready", flush=True)
        told = asyncio.create_task(_told_until())
        done, _ = await asyncio.wait([told, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            if finished is not told:
                finished.result()  # a dashboard that broke breaks the run, loudly
        until = told.result()
        with contextlib.suppress(TimeoutError):  # the streams' last batch is on its way
            await asyncio.wait_for(asyncio.gather(*(b.reach(until) for b in boards)), READY_WAIT_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.aclose()
    took = sorted(t for b in boards for t in b.took_ms[1:])
    print(
        json.dumps(
            {
                "events": sum(b.events for b in boards),
                "refreshes": len(took),
                "refresh_ms_p50": round(took[len(took) // 2], 1) if took else None,
            }
        ),
        flush=True,
    )


_EVENT_ID = re.compile(rb"^id: (\d+)$", re.MULTILINE)


async def _told_until() -> int:
    """The event id the harness says the streams should reach (0: none), once stdin closes."""
    loop = asyncio.get_running_loop()
    said = await loop.run_in_executor(None, sys.stdin.read)
    found = re.search(r"until (\d+)", said)
    return int(found.group(1)) if found else 0


if __name__ == "__main__":
    asyncio.run(_run_clients(sys.argv[1], os.environ[TOKEN_ENV], int(sys.argv[2])))
