"""A revoked token stops working on every manager at once: the revocation crosses the event bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import httpx
import pytest

from corral.api import auth
from corral.api.app import ApiContext, create_app
from corral.controller.agents import AgentController
from corral.controller.sessions import SessionController
from corral.infra.events import EventBus, forget_on_events, open_event_bus
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database
from corral.store.events import TOKEN_REVOKED, read_events
from corral.store.users import create_user, issue_token
from tests.conftest import REDIS_URL
from tests.integration._polling import eventually
from tests.integration.store._factories import NOW


@pytest.fixture
async def managers(
    db: Database, kind: str, namespace: str
) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Two managers' APIs on one database, each with its bus of `kind` and its cache watcher."""
    async with AsyncExitStack() as stack:
        shared: EventBus | None = None
        clients = []
        for name in ("a", "b"):
            if kind == "memory" and shared is not None:
                bus = shared  # in-process buses share events within one bus object
            else:
                bus = await open_event_bus(kind, prefix=namespace, db=db, redis_url=REDIS_URL)  # type: ignore[arg-type]
                stack.push_async_callback(bus.close)
                shared = bus
            hints = MemoryHintBus()
            app = create_app(
                ApiContext(
                    db=db,
                    agents=AgentController(db, hints, join_token="join"),
                    sessions=SessionController(db, hints, bus),
                    events=bus,
                )
            )
            cache = app.state.token_cache
            cache["sentinel"] = (float("inf"), None)
            watcher = asyncio.create_task(forget_on_events(bus, {TOKEN_REVOKED: cache.clear}))
            stack.callback(watcher.cancel)

            async def subscribed(cache: dict[str, object] = cache) -> bool:
                return not cache  # the watcher clears the cache once it listens

            await eventually(subscribed, f"manager {name}'s watcher to subscribe")
            transport = httpx.ASGITransport(app=app)
            clients.append(
                await stack.enter_async_context(
                    httpx.AsyncClient(transport=transport, base_url=f"http://{name}")
                )
            )
        yield clients


@pytest.mark.parametrize(
    ("database_url", "kind"),
    [
        ("sqlite", "memory"),
        pytest.param("sqlite", "redis", marks=pytest.mark.redis),
        pytest.param("postgresql", "postgres", marks=pytest.mark.postgres),
    ],
    indirect=["database_url"],
)
async def test_a_revoked_token_stops_working_on_every_manager_at_once(
    db: Database, managers: list[httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Manager B has carol's token cached; manager A revokes it; B refuses it well before its
    cache would have expired (an hour here: only the revocation event can clear it). The
    revocation is in the audit log, owned by carol, without the secret."""
    monkeypatch.setattr(auth, "CACHE_S", 3600.0)
    a, b = managers
    admin = await issue_token(db, await create_user(db, "root", "admin", NOW), "t", NOW)
    carol_id = await create_user(db, "carol", "user", NOW)
    carol = await issue_token(db, carol_id, "laptop", NOW)
    admin_headers = {"Authorization": f"Bearer {admin.secret}"}
    carol_headers = {"Authorization": f"Bearer {carol.secret}"}
    assert (await b.get("/v1/me", headers=carol_headers)).status_code == 200  # cached on B

    revoked = await a.delete(f"/v1/tokens/{carol.id}", headers=admin_headers)
    assert revoked.status_code == 204, revoked.text

    async def refused() -> bool:
        return (await b.get("/v1/me", headers=carol_headers)).status_code == 401

    await eventually(refused, "manager B to refuse the revoked token")

    logged = [e for e in await read_events(db, after_id=0) if e.kind == TOKEN_REVOKED]
    assert [(e.entity_type, e.entity_id, e.owner_id) for e in logged] == [
        ("token", str(carol.id), carol_id)
    ]
    assert carol.secret not in logged[0].to_json()
