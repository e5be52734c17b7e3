"""The restart policy in the kernel worker and the shipper: a non-zero exit while RUNNING starts
the kernel again by ERROR → GENERATING up to the session's restart_limit, each restart reported
down and up; past the limit the kernel fails as without; an adopted restart is counted on from."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from corral.agent.kernel_worker import NONZERO_EXIT_CAUSE, KernelWorker, WorkerSettings
from corral.agent.progress import Progress
from corral.agent.protocol import AssignedKernelMessage, KernelReportMessage
from corral.agent.runtime import KernelExit, RunningKernel
from corral.agent.shipper import Backoff, ReportShipper
from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus

from ._fakes import (
    KID,
    FakeKernel,
    FakeManagerClient,
    FakeRuntime,
    FakeShipper,
    FakeSleep,
    Watch,
    assigned,
    launch_of,
)

P, K = Progress, KernelStatus
T0 = datetime(2030, 1, 1, tzinfo=UTC)
PARKED_S = 3600.0
SETTINGS = WorkerSettings(log_interval_s=PARKED_S, retry_delay_s=0.25, retry_delay_cap_s=5.0)


class Rig:
    """One worker over the fakes, run to RUNNING."""

    def __init__(
        self, kernel: AssignedKernelMessage, adopt_info: dict[str, object] | None = None
    ) -> None:
        self.watch = Watch()
        self.runtime = FakeRuntime(watch=self.watch)
        self.shipper = FakeShipper(self.watch)
        # Adopting: a kernel an earlier agent started, running.
        self.adopted = FakeKernel(self.watch, adopt_info or {}, {}, {}, None)

        async def adopted() -> RunningKernel:
            return self.adopted

        self.worker = KernelWorker(
            kernel,
            launch_of(kernel),
            self.runtime,
            self.shipper,
            settings=SETTINGS,
            clock=lambda: T0,
            sleep=FakeSleep(park=(PARKED_S,), watch=self.watch),
            adopt=adopted if adopt_info is not None else None,
        )
        self.task = asyncio.create_task(self.worker.run())

    async def running(self) -> None:
        await self.watch.until(lambda: K.PREPARED in self.shipper.statuses)
        self.worker.update(assigned(status=K.CREATING, desired=KernelIntent.RUN))
        await self.started(1)

    async def started(self, n: int) -> None:
        """Until the runtime has started the kernel `n` times and the last one runs."""
        await self.watch.until(lambda: len(self.runtime.launches) >= n)
        await self.watch.until(lambda: self.shipper.reports[-1].status is K.RUNNING)

    def exit(self, code: int) -> None:
        self.runtime.kernels[KID].exit(KernelExit(code))

    async def finished(self) -> None:
        async with asyncio.timeout(2):
            await self.task

    def restart_reports(self) -> list[tuple[int | None, bool, int | None]]:
        return [
            (r.restarts, r.restarting, r.exit_code)
            for r in self.shipper.reports
            if r.restarts is not None
        ]


@pytest.fixture
async def rigs() -> AsyncIterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.task.cancel()
    await asyncio.gather(*(r.task for r in made), return_exceptions=True)


async def test_a_nonzero_exit_restarts_the_kernel_by_error_to_generating(rigs: list[Rig]) -> None:
    """Limit 1, exit 3 then 0: started twice (the second as restart 1), reported down (exit 3)
    and up; the kernel then ends TERMINATED 0; the progress machine went GENERATING → ERROR →
    GENERATING."""
    rig = Rig(assigned(restart_limit=1))
    rigs.append(rig)
    await rig.running()
    rig.exit(3)
    await rig.started(2)
    assert [launch.restart for launch in rig.runtime.launches] == [0, 1]
    assert rig.restart_reports() == [(1, True, 3), (1, False, None)]
    down = next(r for r in rig.shipper.reports if r.restarting)
    assert down.failure_cause == NONZERO_EXIT_CAUSE and "restart 1 of 1" in (down.message or "")
    rig.exit(0)
    await rig.finished()
    assert rig.shipper.reports[-1].status is K.TERMINATED
    assert rig.shipper.reports[-1].exit_code == 0
    steps = [step.state for step in rig.worker.progress.history]
    at = steps.index(P.ERROR)
    assert steps[at - 1 : at + 2] == [P.GENERATING, P.ERROR, P.GENERATING]


async def test_past_the_limit_the_kernel_fails_as_without_restarts(rigs: list[Rig]) -> None:
    """Limit 1 and two non-zero exits: one restart, then ERROR with the last exit code and the
    non-zero-exit cause, as a kernel without the policy ends."""
    rig = Rig(assigned(restart_limit=1))
    rigs.append(rig)
    await rig.running()
    rig.exit(3)
    await rig.started(2)
    rig.exit(5)
    await rig.finished()
    assert len(rig.runtime.launches) == 2
    end = rig.shipper.reports[-1]
    assert (end.status, end.failure_cause, end.exit_code) == (K.ERROR, NONZERO_EXIT_CAUSE, 5)


async def test_without_a_limit_a_nonzero_exit_fails_at_once(rigs: list[Rig]) -> None:
    """restart_limit 0 (the default): no restart, no restart report."""
    rig = Rig(assigned())
    rigs.append(rig)
    await rig.running()
    rig.exit(3)
    await rig.finished()
    assert len(rig.runtime.launches) == 1 and rig.restart_reports() == []
    assert rig.shipper.reports[-1].status is K.ERROR


async def test_restarts_the_manager_counted_are_spent(rigs: list[Rig]) -> None:
    """Placed again with its one restart already made (the manager's count): no restart."""
    rig = Rig(assigned(restart_limit=1, restarts=1))
    rigs.append(rig)
    await rig.running()
    rig.exit(3)
    await rig.finished()
    assert len(rig.runtime.launches) == 1
    assert rig.shipper.reports[-1].status is K.ERROR


async def test_an_adopted_restart_is_counted_on_from_never_started_again(
    rigs: list[Rig],
) -> None:
    """An agent restarted while restart 1 ran (the manager never heard it): the adopted kernel
    is restart 1, reported up; its exit starts restart 2, not 1 again."""
    kernel = assigned(status=K.RUNNING, desired=KernelIntent.RUN, restart_limit=2)
    rig = Rig(kernel, {"host": "h", "restart": 1})
    rigs.append(rig)
    await rig.watch.until(lambda: rig.restart_reports() == [(1, False, None)])
    rig.adopted.exit(KernelExit(3))
    await rig.watch.until(lambda: len(rig.runtime.launches) == 1)
    assert rig.runtime.launches[0].restart == 2
    await rig.watch.until(lambda: rig.restart_reports()[-1] == (2, False, None))


async def test_a_restart_announced_but_never_started_is_started_once_by_the_adopter(
    rigs: list[Rig],
) -> None:
    """The earlier agent reported restart 1 under way and died before starting it: the record
    shows the first run, which exited 3. The adopter starts restart 1 (once), reporting it
    again as the manager knows it (acknowledged there) and then running."""
    kernel = assigned(
        status=K.RUNNING, desired=KernelIntent.RUN, restart_limit=1, restarts=1, restarting=True
    )
    rig = Rig(kernel, {"host": "h"})
    rigs.append(rig)
    rig.adopted.exit(KernelExit(3))
    await rig.watch.until(lambda: len(rig.runtime.launches) == 1)
    assert rig.runtime.launches[0].restart == 1
    await rig.watch.until(lambda: rig.restart_reports() == [(1, True, 3), (1, False, None)])
    rig.runtime.kernels[KID].exit(KernelExit(0))
    await rig.finished()
    assert rig.shipper.reports[-1].status is K.TERMINATED


# -- the shipper ------------------------------------------------------------------------------


def _restart(restarts: int, restarting: bool) -> KernelReportMessage:
    return KernelReportMessage(
        kernel_id=KID, status=K.RUNNING, attempt=1, restarts=restarts, restarting=restarting
    )


async def test_the_shipper_sends_restarts_past_running_and_never_one_acknowledged() -> None:
    """RUNNING acknowledged: a restart report is still news; one the manager acknowledged (or
    its assignment shows passed) is not sent again after a lost answer."""
    watch = Watch()
    client = FakeManagerClient(watch=watch)
    shipper = ReportShipper(client, "agent-1", Backoff(0.1, 1.0), FakeSleep(watch=watch))
    task = asyncio.create_task(shipper.run())
    try:
        shipper.acknowledge(KID, 1, K.RUNNING)
        down, up = _restart(1, True), _restart(1, False)
        shipper.report(down)
        assert await shipper.flush(2.0)
        shipper.report(down)  # queued again (a lost answer): acknowledged, dropped
        shipper.report(up)
        assert await shipper.flush(2.0)
        shipper.acknowledge(KID, 1, K.RUNNING, 4)  # the assignment shows restart 2 under way
        shipper.report(_restart(2, True))
        assert await shipper.flush(2.0)
        assert client.delivered == [[down], [up]]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
