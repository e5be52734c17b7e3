"""Draining: a replica taken out (scale down, rolling update) first leaves the route table, so
the proxies send it no new request, and its session is ended once no proxy has a request in
flight to it, or once its grace period has passed.

"No request in flight" is believed only of proxies that have seen the table without it: every
live proxy must report a route table revision published after the route started draining, and
no request in flight to the replica. A proxy that stops reporting ages out
(`store.proxy_reports`); with no live proxy, nothing can be in flight.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from corral.domain.deployment import ROUTE_CHANGED
from corral.domain.status import EndpointLifecycle
from corral.handlers.serving_base import Target
from corral.store.database import Database
from corral.store.proxy_reports import read_proxy_load, route_table_revision_after
from corral.store.tables import events


def draining(route: Target, now: datetime) -> bool:
    """Whether the route is still within its drain (a deployment being destroyed drains not)."""
    until: datetime | None = route.get("drain_until")
    return (
        until is not None
        and now < until
        and route.get("deployment_lifecycle") != EndpointLifecycle.DESTROYING.value
    )


async def still_serving(
    db: Database, routes: Sequence[Target], now: datetime
) -> dict[uuid.UUID, str]:
    """Of these draining routes, those that may still have requests in flight, and why."""
    if not routes:
        return {}
    waiting: dict[uuid.UUID, str] = {}
    async with db.read() as conn:
        load = await read_proxy_load(conn, now)
        if load.proxies == 0:
            return {}
        for route in routes:
            drained_from = await conn.scalar(
                sa.select(sa.func.max(events.c.id)).where(
                    events.c.entity_id == str(route["id"]), events.c.kind == ROUTE_CHANGED
                )
            )
            published = await route_table_revision_after(conn, int(drained_from or 0))
            address = f"{route['host']}:{route['port']}"
            inflight = load.at(route["deployment_id"], address)
            if published is None:
                waiting[route["id"]] = "the route table without it is not published yet"
            elif load.oldest_revision is None or load.oldest_revision < published:
                waiting[route["id"]] = "a proxy has not seen the route table without it yet"
            elif inflight > 0:
                waiting[route["id"]] = f"{inflight} request(s) in flight"
    return waiting
