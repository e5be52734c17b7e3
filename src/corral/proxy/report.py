"""The proxy's load report: its requests in flight per deployment and replica (draining ones
included) and the route table revision it forwards by go to the manager, which sums the live
proxies' for draining and autoscaling.

Looked at every PROXY_REPORT_INTERVAL_S and sent when it changed, else every
PROXY_REPORT_KEEPALIVE_S so the manager knows the proxy lives (a report older than
PROXY_REPORT_TTL_S is a proxy gone): an idle proxy costs its manager a request every 2 s, not
every second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from corral.client import Client, CorralError
from corral.domain.deployment import PROXY_REPORT_INTERVAL_S, PROXY_REPORT_KEEPALIVE_S
from corral.proxy.table import RouteTable

logger = logging.getLogger(__name__)


def new_proxy_id() -> str:
    """A name for this proxy's reports: its host, process and a random part (a restarted
    proxy is a new one; the old one's report ages out)."""
    host = socket.gethostname().split(".")[0][:32] or "proxy"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def report_load(
    client_factory: Callable[[], Client],
    table: RouteTable,
    proxy_id: str,
    *,
    interval_s: float = PROXY_REPORT_INTERVAL_S,
    keepalive_s: float = PROXY_REPORT_KEEPALIVE_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Report `table`'s requests in flight until cancelled; manager outages are waited out."""
    sent: tuple[int, dict[str, dict[str, int]]] | None = None  # the last report it accepted
    sent_at = 0.0
    while True:
        try:
            async with client_factory() as client:
                while True:
                    report = (max(table.revision, 0), table.inflight())
                    if report != sent or clock() - sent_at >= keepalive_s:
                        await client.report_proxy_load(proxy_id, *report)
                        sent, sent_at = report, clock()
                    await sleep(interval_s)
        except (CorralError, OSError) as exc:
            logger.warning("proxy.report_failed", extra={"error": str(exc)})
            sent = None  # unknown whether the manager has it: send it again
            await sleep(interval_s)
