"""What the proxies report: requests in flight per deployment and replica, and the route table
revision each forwards by. Several proxies may run: their counts are summed; a proxy whose
last report is older than PROXY_REPORT_TTL_S counts no more (it stopped, or lost the manager).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.deployment import PROXY_REPORT_TTL_S, ROUTE_TABLE_CHANGED, ROUTE_TABLE_ID
from corral.store.tables import events, proxy_reports

# Reports this much older than the TTL are deleted when any proxy reports.
_FORGET_AFTER_TTLS = 12


@dataclass
class ProxyLoad:
    """The live proxies' reports, summed: requests in flight per deployment and replica
    address, and the oldest route table revision a live proxy forwards by."""

    proxies: int = 0
    oldest_revision: int | None = None
    inflight: dict[str, dict[str, int]] = field(default_factory=dict)

    def of_deployment(self, deployment_id: uuid.UUID) -> int:
        """Requests in flight to the deployment's replicas, through every live proxy."""
        return sum(self.inflight.get(str(deployment_id), {}).values())

    def at(self, deployment_id: uuid.UUID, address: str) -> int:
        """Requests in flight to one replica (host:port), through every live proxy."""
        return self.inflight.get(str(deployment_id), {}).get(address, 0)


async def write_proxy_report(
    conn: AsyncConnection,
    proxy_id: str,
    table_revision: int,
    inflight: Mapping[str, Mapping[str, int]],
    now: datetime,
) -> None:
    """Replace the proxy's last report; forget proxies silent for long."""
    counts = {d: {a: n for a, n in by.items() if n > 0} for d, by in inflight.items()}
    await conn.execute(
        proxy_reports.delete().where(
            sa.or_(
                proxy_reports.c.proxy_id == proxy_id,
                proxy_reports.c.reported_at
                < now - timedelta(seconds=_FORGET_AFTER_TTLS * PROXY_REPORT_TTL_S),
            )
        )
    )
    await conn.execute(
        proxy_reports.insert().values(
            proxy_id=proxy_id,
            table_revision=table_revision,
            inflight={d: by for d, by in counts.items() if by},
            reported_at=now,
        )
    )


async def read_proxy_load(conn: AsyncConnection, now: datetime) -> ProxyLoad:
    """The live proxies' reports, summed."""
    rows = await conn.execute(
        sa.select(proxy_reports.c.table_revision, proxy_reports.c.inflight).where(
            proxy_reports.c.reported_at >= now - timedelta(seconds=PROXY_REPORT_TTL_S)
        )
    )
    load = ProxyLoad()
    for revision, inflight in rows:
        load.proxies += 1
        revision = int(revision)
        if load.oldest_revision is None or revision < load.oldest_revision:
            load.oldest_revision = revision
        for deployment_id, by_address in (inflight or {}).items():
            summed = load.inflight.setdefault(deployment_id, {})
            for address, count in by_address.items():
                summed[address] = summed.get(address, 0) + int(count)
    return load


async def route_table_revision_after(conn: AsyncConnection, event_id: int) -> int | None:
    """The first route table revision published after event `event_id` (None: none yet): a
    proxy forwarding by it or a later one has seen what that event's change did to the table."""
    found = await conn.scalar(
        sa.select(sa.func.min(events.c.id)).where(
            events.c.entity_id == ROUTE_TABLE_ID,
            events.c.kind == ROUTE_TABLE_CHANGED,
            events.c.id > event_id,
        )
    )
    return None if found is None else int(found)
