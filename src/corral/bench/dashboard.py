"""`corral bench dashboard`: how long the dashboard's pages take with many sessions stored.

A scratch database gets `sessions` placed sessions (one owner, 100 agents: as many live
kernels); the API app with the dashboard runs in this process and each page (the sessions and
agents pages among them) is asked for `requests` times in turn, signed in through the sign-in
form as an admin (who sees every session), after a few warm-up requests. Times are the request's
whole time through the app in process (no network), so they are the server's time.
"""

from __future__ import annotations

import time

import httpx

from corral.api.app import ApiContext, create_app
from corral.bench._scratch import scratch_database, seed_placed_sessions
from corral.bench.latency import percentile
from corral.controller.agents import AgentController
from corral.controller.sessions import SessionController
from corral.domain.record import record
from corral.domain.types import utcnow
from corral.infra.events.memory import MemoryEventBus
from corral.infra.hints.memory import MemoryHintBus
from corral.store.users import create_user, issue_token
from corral.web.auth import COOKIE

PAGES = ("/ui/sessions", "/ui", "/ui/queue", "/ui/agents", "/ui/deployments", "/ui/events")
WARMUP_REQUESTS = 3


@record
class DashboardBenchResult:
    """Per page, the p50 and p95 of its time in milliseconds."""

    backend: str
    sessions: int
    requests: int
    pages: dict[str, dict[str, float]]

    def as_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "sessions": self.sessions,
            "requests": self.requests,
            "pages": self.pages,
        }


async def run_dashboard_bench(url: str, sessions: int, requests: int) -> DashboardBenchResult:
    """Seed `sessions`, then time `requests` loads of each page."""
    async with scratch_database(url) as db:
        now = utcnow()
        await seed_placed_sessions(db, sessions, now)
        admin = await create_user(db, "bench-admin", "admin", now)
        token = (await issue_token(db, admin, "bench", now)).secret
        hints = MemoryHintBus()
        events = MemoryEventBus("bench")
        app = create_app(
            ApiContext(
                db=db,
                agents=AgentController(db, hints, join_token=None),
                sessions=SessionController(db, hints, events),
                events=events,
            )
        )
        figures: dict[str, dict[str, float]] = {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            signed_in = await http.post("/ui/sign-in", data={"token": token})
            if signed_in.status_code != 303 or COOKIE not in signed_in.cookies:
                raise RuntimeError(f"signing in answered {signed_in.status_code}")
            for page in PAGES:
                times_ms = []
                for i in range(WARMUP_REQUESTS + requests):
                    started = time.perf_counter()
                    answer = await http.get(page)
                    took_ms = (time.perf_counter() - started) * 1000
                    if answer.status_code != 200:
                        raise RuntimeError(f"{page} answered {answer.status_code}")
                    if i >= WARMUP_REQUESTS:
                        times_ms.append(took_ms)
                figures[page] = {
                    "p50_ms": round(percentile(times_ms, 0.5), 1),
                    "p95_ms": round(percentile(times_ms, 0.95), 1),
                }
        return DashboardBenchResult(db.dialect, sessions, requests, figures)
