"""Getting reports to the manager: in order, in batches, through outages (with backoff)."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable

from corral.agent.client import ManagerClient, ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import MAX_BATCH, KernelReportMessage, LogChunkMessage, OutputMessage

logger = logging.getLogger(__name__)


class Backoff:
    """Exponential backoff with full jitter: 0…min(max, initial·2ⁿ); reset on success."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._rng = rng or random.Random()
        self._failures = 0

    def next_delay_s(self) -> float:
        """The delay before the next attempt (capped before exponentiating: no overflow)."""
        exponent = min(self._failures, 32)
        self._failures += 1
        return self._rng.uniform(0, min(self._max_s, self._initial_s * 2**exponent))

    def reset(self) -> None:
        """The last attempt worked."""
        self._failures = 0

    @property
    def failing(self) -> bool:
        """Whether the last attempt failed."""
        return self._failures > 0


class ReportShipper:
    """Sends the workers' reports in order and in batches; uploads logs and outputs."""

    def __init__(
        self,
        client: ManagerClient,
        agent_id: str,
        backoff: Backoff,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._agent_id = agent_id
        self._backoff = backoff
        self._sleep = sleep
        self._queue: list[KernelReportMessage] = []
        self._queued = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.sent = 0

    def report(self, report: KernelReportMessage) -> None:
        """Queue one report."""
        self._queue.append(report)
        self._idle.clear()
        self._queued.set()

    async def upload_logs(self, chunks: list[LogChunkMessage]) -> None:
        """Upload log chunks now."""
        await self._client.upload_logs(self._agent_id, chunks)

    async def upload_outputs(self, outputs: list[OutputMessage]) -> None:
        """Upload output files now."""
        await self._client.upload_outputs(self._agent_id, outputs)

    async def fetch_upload(self, kernel_id: uuid.UUID) -> bytes:
        """The kernel's upload, fetched now."""
        return await self._client.fetch_upload(self._agent_id, kernel_id)

    async def run(self) -> None:
        """Deliver queued reports until cancelled."""
        while True:
            await self._queued.wait()
            self._queued.clear()
            while self._queue:
                batch = self._queue[:MAX_BATCH]
                try:
                    await self._client.report(self._agent_id, batch)
                except ManagerUnavailableError as exc:
                    if not self._backoff.failing:
                        logger.warning("agent.reports_undelivered", extra={"error": str(exc)})
                    await self._sleep(self._backoff.next_delay_s())
                    continue
                except ManagerRejectedError as exc:
                    self._drop_refused(batch, exc)
                    continue
                self._backoff.reset()
                del self._queue[: len(batch)]
                self.sent += len(batch)
            self._idle.set()

    async def flush(self, timeout_s: float) -> bool:
        """Until every queued report is delivered, or `timeout_s`; True if delivered."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _drop_refused(self, batch: list[KernelReportMessage], exc: ManagerRejectedError) -> None:
        """A refused batch changed nothing: drop what was refused, send the rest again."""
        refused = set(exc.conflicts) if exc.status == 409 and exc.conflicts else None
        logger.error(
            "agent.reports_refused",
            extra={"status": exc.status, "detail": str(exc), "kernels": sorted(refused or [])},
        )
        keep = [] if refused is None else [r for r in batch if str(r.kernel_id) not in refused]
        self._queue[: len(batch)] = keep
