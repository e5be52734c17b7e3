"""HTTP health probes of replicas: a batch at once with a bound on concurrency, each with its
own time limit, so a slow replica never holds up the others or the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx

from corral.domain.deployment import HealthCheck
from corral.domain.record import record

# Probes in flight at once, whatever the batch's size.
PROBE_CONCURRENCY = 32


@record
class ProbeTarget:
    """Where to probe and how."""

    host: str
    port: int
    check: HealthCheck


@record
class ProbeOutcome:
    """A probe's verdict, and what a user reads about it (`200 in 3 ms`, `timed out`)."""

    passed: bool
    said: str


async def probe_all(targets: Sequence[ProbeTarget]) -> list[ProbeOutcome]:
    """Probe every target (GET its check's path), at most PROBE_CONCURRENCY at a time."""
    if not targets:
        return []
    bound = asyncio.Semaphore(PROBE_CONCURRENCY)
    # No pooled connections: a replica that is replaced reuses no socket of its predecessor.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as http:

        async def one(target: ProbeTarget) -> ProbeOutcome:
            async with bound:
                return await _probe(http, target)

        return list(await asyncio.gather(*(one(t) for t in targets)))


async def _probe(http: httpx.AsyncClient, target: ProbeTarget) -> ProbeOutcome:
    check = target.check
    url = f"http://{target.host}:{target.port}{check.path}"
    started = time.perf_counter()
    try:
        answer = await http.get(url, timeout=check.timeout_s)
    except httpx.TimeoutException:
        return ProbeOutcome(False, f"no answer within {check.timeout_s:g} s")
    except httpx.HTTPError as exc:
        return ProbeOutcome(False, f"{type(exc).__name__}: {exc}"[:200])
    took_ms = (time.perf_counter() - started) * 1000
    said = f"{answer.status_code} in {took_ms:.0f} ms"
    if answer.status_code != check.expected_status:
        said += f" (expected {check.expected_status})"
    return ProbeOutcome(answer.status_code == check.expected_status, said)
