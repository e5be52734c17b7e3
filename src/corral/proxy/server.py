"""`corral proxy`: the forwarding app on its own HTTP server, and the task that keeps its route
table current: read from the manager, then re-read on every change event the manager pushes
(within moments), and every few seconds in case an event was missed, over one client and one
event stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from corral.client import Client, CorralError
from corral.domain.deployment import ROUTE_TABLE_ID
from corral.proxy.forward import ProxyApp
from corral.proxy.http_server import serve_http
from corral.proxy.report import new_proxy_id, report_load
from corral.proxy.table import RouteTable, TableEntry

logger = logging.getLogger(__name__)

# The table is read again this often even when no change event came (a missed event, a
# manager restarted): the push makes changes fast, the poll keeps the table right.
POLL_S = 5.0


async def refresh(client: Client, table: RouteTable) -> None:
    """Read the manager's route table into `table`."""
    found = await client.route_table()
    if found.revision != table.revision:
        table.replace(
            found.revision,
            [
                TableEntry(str(d.id), d.name, d.addresses, d.access, d.token_hash)
                for d in found.deployments
            ],
        )
        logger.info(
            "proxy.table_changed",
            extra={"revision": found.revision, "deployments": len(found.deployments)},
        )


async def follow_table(
    client_factory: Callable[[], Client], table: RouteTable, *, poll_s: float = POLL_S
) -> None:
    """Keep `table` current until cancelled; manager outages are waited out.

    One client and one event stream for as long as they work: the poll reads the table beside
    the stream (it used to end the stream and open a new client every poll, the proxy's most
    expensive habit at idle); a stream that ends, or an error, starts over.
    """
    while True:
        try:
            async with client_factory() as client:
                await refresh(client, table)
                await _first_to_end(_on_changes(client, table), _poll(client, table, poll_s))
        except (CorralError, OSError) as exc:
            logger.warning("proxy.table_unavailable", extra={"error": str(exc)})
            await asyncio.sleep(1.0)


async def _first_to_end(*work: Coroutine[Any, Any, None]) -> None:
    """Run `work` until one of it ends (its error raised); the rest is cancelled."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _poll(client: Client, table: RouteTable, poll_s: float) -> None:
    """Read the table every `poll_s`, in case a change event was missed."""
    while True:
        await asyncio.sleep(poll_s)
        await refresh(client, table)


async def _on_changes(client: Client, table: RouteTable) -> None:
    stream = client.follow_events(since=max(table.revision, 0), entity_id=ROUTE_TABLE_ID)
    async with contextlib.aclosing(stream) as events:
        async for _ in events:
            await refresh(client, table)


async def serve_proxy(
    sock: socket.socket,
    client_factory: Callable[[], Client],
    *,
    domain: str | None = None,
    ready: Callable[[], None] | None = None,
) -> None:
    """Serve the proxy on `sock` until cancelled; with `domain`, `Host: <deployment>.<domain>`
    names a deployment too."""
    table = RouteTable()
    app = ProxyApp(table, domain=domain)
    follower = asyncio.create_task(follow_table(client_factory, table), name="proxy-table")
    reporter = asyncio.create_task(
        report_load(client_factory, table, new_proxy_id()), name="proxy-report"
    )
    try:
        # The socket listens already: requests wait in its backlog until the server accepts.
        await serve_http(app, sock, ready=ready)
    finally:
        follower.cancel()
        reporter.cancel()
        await asyncio.gather(follower, reporter, return_exceptions=True)
        await app.aclose()
        sock.close()
