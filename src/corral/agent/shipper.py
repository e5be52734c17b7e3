"""Getting reports to the manager: in order, in batches, through outages (with backoff)."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable

from corral.agent.client import ManagerClient, ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import MAX_BATCH, KernelReportMessage, LogChunkMessage, OutputMessage
from corral.domain.restarts import restart_position
from corral.domain.status import KERNEL_STAGE, KernelStatus

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
    """Sends the workers' reports in order and in batches; uploads logs and outputs.

    It keeps, per kernel placement, the last status the manager acknowledged (an answered
    report not refused, or the status an assignment shows), and sends only what is newer: a
    batch whose answer was lost is sent again without what the manager has shown it has since.
    A refused report is dropped alone; the manager applied the batch's others.
    """

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
        # kernel → (its placement, the last status the manager acknowledged of it, and how
        # far its restarts came: `restart_position`, 0 when not known)
        self._acked: dict[uuid.UUID, tuple[int | None, KernelStatus, int]] = {}
        self._answers: set[int] = set()  # queued reports (by id) that answer a question
        self.sent = 0

    def report(self, report: KernelReportMessage, *, answer: bool = False) -> None:
        """Queue one report; `answer`: sent even if not newer (the manager asked about it)."""
        if answer:
            self._answers.add(id(report))
        self._queue.append(report)
        self._idle.clear()
        self._queued.set()

    def acknowledge(
        self,
        kernel_id: uuid.UUID,
        attempt: int | None,
        status: KernelStatus,
        restarted: int = 0,
    ) -> None:
        """The manager has the kernel at `status` (its assignment says so), its restarts at
        position `restarted`: nothing at or before it needs sending."""
        known = self._acked.get(kernel_id)
        if known is not None and known[0] == attempt:
            stage, known_stage = KERNEL_STAGE[status], KERNEL_STAGE[known[1]]
            if stage > known_stage or (stage == known_stage and restarted > known[2]):
                self._acked[kernel_id] = (attempt, status, max(restarted, known[2]))
        elif known is None or _later(attempt, known[0]):
            self._acked[kernel_id] = (attempt, status, restarted)

    def forget(self, kernel_id: uuid.UUID) -> None:
        """The kernel left this agent: drop its delivery state."""
        self._acked.pop(kernel_id, None)

    def acknowledged(self, report: KernelReportMessage) -> bool:
        """Whether the manager acknowledged this report (or a later status of its kernel)."""
        return not self._newer(report)

    def pending(self, kernel_id: uuid.UUID) -> bool:
        """Whether a report of the kernel waits to be delivered (or is on its way)."""
        return any(r.kernel_id == kernel_id for r in self._queue)

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
                taken = len(self._queue[:MAX_BATCH])
                batch = [r for r in self._queue[:taken] if self._newer(r) or self._answering(r)]
                if not batch:
                    self._drop(taken)
                    continue
                try:
                    answer = await self._client.report(self._agent_id, batch)
                except ManagerUnavailableError as exc:
                    # Perhaps applied, its answer lost: sent again, as far as still newer.
                    if not self._backoff.failing:
                        logger.warning("agent.reports_undelivered", extra={"error": str(exc)})
                    await self._sleep(self._backoff.next_delay_s())
                    continue
                except ManagerRejectedError as exc:
                    # The request itself was refused (not one report): it would be again.
                    logger.error(
                        "agent.reports_rejected", extra={"status": exc.status, "detail": str(exc)}
                    )
                    self._drop(taken)
                    continue
                self._backoff.reset()
                self._drop(taken)
                self._answered(batch, answer.refused)
                self.sent += len(batch)
            self._idle.set()

    async def flush(self, timeout_s: float) -> bool:
        """Until every queued report is delivered, or `timeout_s`; True if delivered."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _drop(self, taken: int) -> None:
        """The first `taken` queued reports are done with (delivered, or not to be sent)."""
        if self._answers:
            for report in self._queue[:taken]:
                self._answers.discard(id(report))
        del self._queue[:taken]

    def _answering(self, report: KernelReportMessage) -> bool:
        return bool(self._answers) and id(report) in self._answers

    def _newer(self, report: KernelReportMessage) -> bool:
        """Whether the manager may not have this report yet (a failed stage at the status it
        acknowledged is news)."""
        known = self._acked.get(report.kernel_id)
        if known is None:
            return True
        if known[0] != report.attempt:
            return _later(report.attempt, known[0])
        if report.stage_failed:
            return KERNEL_STAGE[report.status] >= KERNEL_STAGE[known[1]]
        stage, known_stage = KERNEL_STAGE[report.status], KERNEL_STAGE[known[1]]
        if report.restarts is not None and stage == known_stage:
            return restart_position(report.restarts, report.restarting) > known[2]
        return stage > known_stage

    def _answered(self, batch: list[KernelReportMessage], refused: dict[str, str]) -> None:
        if refused:
            logger.error(
                "agent.reports_refused", extra={"kernels": sorted(refused), "why": refused}
            )
        for report in batch:
            if not report.stage_failed and str(report.kernel_id) not in refused:
                restarted = 0
                if report.restarts is not None:
                    restarted = restart_position(report.restarts, report.restarting)
                self.acknowledge(report.kernel_id, report.attempt, report.status, restarted)


def _later(attempt: int | None, than: int | None) -> bool:
    """Whether placement `attempt` may be newer than `than` (None: not known, so it may)."""
    return attempt is None or than is None or attempt > than
