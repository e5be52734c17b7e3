"""The proxy's load report: every PROXY_REPORT_INTERVAL_S, its requests in flight per
deployment and replica (draining ones included) and the route table revision it forwards by
go to the manager, which sums the live proxies' for draining and autoscaling."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable

from corral.client import Client, CorralError
from corral.domain.deployment import PROXY_REPORT_INTERVAL_S
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
) -> None:
    """Report `table`'s requests in flight until cancelled; manager outages are waited out."""
    while True:
        try:
            async with client_factory() as client:
                while True:
                    await client.report_proxy_load(
                        proxy_id, max(table.revision, 0), table.inflight()
                    )
                    await asyncio.sleep(interval_s)
        except (CorralError, OSError) as exc:
            logger.warning("proxy.report_failed", extra={"error": str(exc)})
            await asyncio.sleep(interval_s)
