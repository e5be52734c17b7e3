"""KernelWorker: one kernel through the progress machine, its reports, retries, stops, cancels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from corral.agent.kernel_worker import (
    MANAGER_UNREACHABLE_CAUSE,
    NONZERO_EXIT_CAUSE,
    OUTPUT_TOO_LARGE_CAUSE,
    KernelWorker,
    WorkerSettings,
)
from corral.agent.progress import DEFAULT_ERROR_LIMITS, Progress
from corral.agent.protocol import AssignedKernelMessage, KernelReportMessage, LogChunkMessage
from corral.agent.runtime import KERNEL_LOST_CAUSE, KernelExit, LogMark, RunningKernel, StageFailure
from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus

from ._fakes import (
    KID,
    FakeKernel,
    FakeRuntime,
    FakeShipper,
    FakeSleep,
    Watch,
    assigned,
    launch_of,
    unavailable,
)

P, K = Progress, KernelStatus
T0 = datetime(2030, 1, 1, tzinfo=UTC)
LOG_INTERVAL_S = 3600.0  # the log pump's interval: parked, so only stage work ships logs
RETRY_DELAY_S = 0.25
STOP_GRACE_S = 7.0
SETTINGS = WorkerSettings(
    stop_grace_s=STOP_GRACE_S,
    log_interval_s=LOG_INTERVAL_S,
    retry_delay_s=RETRY_DELAY_S,
    retry_delay_cap_s=5.0,
    max_output_bytes=1024,
)
PULL_FAILURE = StageFailure("image_pull_failure", "registry timed out")


@dataclass
class Harness:
    """One worker over the fakes, its run() in a task."""

    worker: KernelWorker
    runtime: FakeRuntime
    shipper: FakeShipper
    sleep: FakeSleep
    watch: Watch
    task: asyncio.Task[None] = field(init=False)

    def start(self) -> Harness:
        self.task = asyncio.create_task(self.worker.run(), name="worker-under-test")
        return self

    async def reported(self, status: KernelStatus) -> None:
        """Until the worker has reported `status`."""
        await self.watch.until(lambda: status in self.shipper.statuses)

    async def finished(self) -> None:
        """Until run() returns (it must not raise)."""
        async with asyncio.timeout(2):
            await self.task

    def desire(self, intent: KernelIntent, status: KernelStatus | None = None) -> None:
        """The manager's next assignment of the kernel: `intent`, with its record at `status`."""
        self.worker.update(assigned(status=status or self.shipper.statuses[-1], desired=intent))

    async def run_to_running(self) -> None:
        """PREPARE, then RUN (the manager moves the kernel to CREATING), until RUNNING."""
        await self.reported(K.PREPARED)
        self.desire(KernelIntent.RUN, K.CREATING)
        await self.reported(K.RUNNING)

    @property
    def kernel(self) -> FakeKernel:
        return self.runtime.kernels[KID]


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Harness]]:
    """Build and start harnesses; any worker task still running at the end is cancelled."""
    made: list[Harness] = []

    def build(
        runtime: FakeRuntime | None = None,
        *,
        settings: WorkerSettings = SETTINGS,
        park: tuple[float, ...] = (LOG_INTERVAL_S,),
        kernel: AssignedKernelMessage | None = None,
        adopt: Callable[[], Awaitable[RunningKernel]] | None = None,
        shipper: FakeShipper | None = None,
    ) -> Harness:
        watch = runtime.watch if runtime is not None else Watch()
        runtime = runtime or FakeRuntime(watch=watch)
        shipper = shipper or FakeShipper(watch)
        sleep = FakeSleep(park=park, watch=watch)
        kernel = kernel or assigned()
        worker = KernelWorker(
            kernel,
            launch_of(kernel),
            runtime,
            shipper,
            settings=settings,
            clock=lambda: T0,
            sleep=sleep,
            adopt=adopt,
        )
        harness = Harness(worker, runtime, shipper, sleep, watch).start()
        made.append(harness)
        return harness

    yield build
    for harness in made:
        harness.task.cancel()
    await asyncio.gather(*(h.task for h in made), return_exceptions=True)


def states(worker: KernelWorker) -> list[Progress]:
    return [step.state for step in worker.progress.history]


def last(shipper: FakeShipper) -> KernelReportMessage:
    return shipper.reports[-1]


# -- the normal run ---------------------------------------------------------------------------


async def test_happy_path_reports_every_status_and_walks_every_post_run_stage(
    make: Callable[..., Harness],
) -> None:
    """PULLING, PREPARED, RUNNING (with runtime_info), TERMINATING, TERMINATED 0; full history."""
    h = make()
    await h.reported(K.PREPARED)
    assert K.RUNNING not in h.shipper.statuses  # PREPARE alone never starts the kernel
    h.desire(KernelIntent.RUN, K.CREATING)
    await h.reported(K.RUNNING)
    h.kernel.exit(KernelExit(0))
    await h.finished()

    assert h.shipper.statuses == [K.PULLING, K.PREPARED, K.RUNNING, K.TERMINATING, K.TERMINATED]
    # Staged once prepared, then started; the unstage at the end finds nothing to give up.
    kernel_id = h.worker.kernel_id
    assert h.runtime.stage_calls == h.runtime.start_calls == h.runtime.unstage_calls == [kernel_id]
    running = h.shipper.reports[2]
    assert running.runtime_info == {"host": "fake-host", "pid": 4242}
    assert last(h.shipper).exit_code == 0
    assert last(h.shipper).failure_cause is None
    assert states(h.worker) == [
        P.NOT_STARTED,
        P.PRELOADING,
        P.PRELOADING_COMPLETE,
        P.GENERATING,
        P.GENERATION_COMPLETE,
        P.PENDING_POST_PROCESSING,
        P.POST_PROCESSING,
        P.POST_PROCESSING_COMPLETE,
        P.PENDING_SAFETY_CHECK,
        P.SAFETY_CHECKING,
        P.SAFETY_CHECK_COMPLETE,
        P.PENDING_SUBMIT,
        P.SUBMITTING,
        P.SUBMIT_COMPLETE,
        P.COMPLETE,
    ]
    assert h.worker.done
    assert h.shipper.logs() == {"stdout": b"hello\n", "stderr": b"warn\n"}
    assert h.kernel.terminate_calls == []


async def test_outputs_within_the_limit_are_uploaded_before_the_final_report(
    make: Callable[..., Harness],
) -> None:
    """Output files are read, uploaded during SUBMITTING, and TERMINATED is reported after."""
    h = make(FakeRuntime(outputs={"model.bin": b"w" * 100}, exit_with=KernelExit(0)))
    await h.run_to_running()
    await h.finished()

    [(name, data)] = [(o.name, o.raw()) for o in h.shipper.events[h.shipper.index("outputs")][1]]
    assert (name, data) == ("model.bin", b"w" * 100)
    assert h.shipper.index("outputs") < h.shipper.index(
        "report", lambda r: r.status is K.TERMINATED
    )


# -- failed runs ------------------------------------------------------------------------------


async def test_nonzero_exit_ends_in_error_after_the_logs_were_uploaded(
    make: Callable[..., Harness],
) -> None:
    """Exit code 3: ERROR kernel_nonzero_exit with exit_code 3, logs uploaded before ERROR."""
    h = make(FakeRuntime(exit_with=KernelExit(3)))
    await h.run_to_running()
    await h.finished()

    assert h.shipper.statuses == [K.PULLING, K.PREPARED, K.RUNNING, K.TERMINATING, K.ERROR]
    error = last(h.shipper)
    assert (error.failure_cause, error.exit_code) == (NONZERO_EXIT_CAUSE, 3)
    assert h.shipper.logs() == {"stdout": b"hello\n", "stderr": b"warn\n"}
    assert h.shipper.index("logs") < h.shipper.index("report", lambda r: r.status is K.ERROR)
    assert h.worker.progress.state is P.REPORTED_FAILED


async def test_out_of_memory_exit_ends_in_error_oom_killed(make: Callable[..., Harness]) -> None:
    """KernelExit(-9, "oom_killed") ends the kernel in ERROR with cause oom_killed."""
    h = make(FakeRuntime(exit_with=KernelExit(-9, "oom_killed", "killed by the OOM killer")))
    await h.run_to_running()
    await h.finished()

    error = last(h.shipper)
    assert (error.status, error.failure_cause, error.exit_code) == (K.ERROR, "oom_killed", -9)
    assert error.message == "killed by the OOM killer"


async def test_outputs_over_the_limit_end_in_error_output_too_large(
    make: Callable[..., Harness],
) -> None:
    """Outputs above max_output_bytes fail the safety check at once: ERROR output_too_large."""
    h = make(FakeRuntime(outputs={"big.bin": b"x" * 1025}, exit_with=KernelExit(0)))
    await h.run_to_running()
    await h.finished()

    error = last(h.shipper)
    assert (error.status, error.failure_cause) == (K.ERROR, OUTPUT_TOO_LARGE_CAUSE)
    assert "1025" in (error.message or "")
    assert h.worker.progress.errors == {P.SAFETY_CHECKING: 1}  # not retried: it cannot help
    assert not any(kind == "outputs" for kind, _ in h.shipper.events)


# -- stage retries ----------------------------------------------------------------------------


async def test_preload_failing_twice_then_succeeding_is_prepared(
    make: Callable[..., Harness],
) -> None:
    """Two retryable preload failures are retried with doubling delays; PREPARED, 2 errors."""
    h = make(FakeRuntime(preload_failures=[PULL_FAILURE, PULL_FAILURE]))
    await h.reported(K.PREPARED)

    assert len(h.runtime.preload_calls) == 3
    assert h.worker.progress.errors == {P.PRELOADING: 2}
    assert h.worker.progress.state is P.PRELOADING_COMPLETE
    assert h.shipper.statuses == [K.PULLING, K.PREPARED]
    assert h.sleep.delays == [RETRY_DELAY_S, 2 * RETRY_DELAY_S]


async def test_preload_failing_forever_gives_up_at_the_preloading_limit(
    make: Callable[..., Harness],
) -> None:
    """A preload that always fails is tried exactly 3 times, then ERROR image_pull_failure."""
    h = make(FakeRuntime(preload_fails_forever=PULL_FAILURE))
    await h.finished()

    assert len(h.runtime.preload_calls) == DEFAULT_ERROR_LIMITS[P.PRELOADING] == 3
    assert h.shipper.statuses == [K.PULLING, K.ERROR]
    assert last(h.shipper).failure_cause == "image_pull_failure"
    assert last(h.shipper).message == "registry timed out"
    assert h.worker.progress.state is P.REPORTED_FAILED
    assert h.runtime.start_calls == []


async def test_non_retryable_start_failure_is_tried_once(make: Callable[..., Harness]) -> None:
    """A start failure marked not retryable is attempted once, then ERROR kernel_start_failure."""
    failure = StageFailure("kernel_start_failure", "no such command", retryable=False)
    h = make(FakeRuntime(start_failure=failure))
    await h.reported(K.PREPARED)
    h.desire(KernelIntent.RUN, K.CREATING)
    await h.finished()

    assert len(h.runtime.start_calls) == 1
    assert h.shipper.statuses == [K.PULLING, K.PREPARED, K.ERROR]
    assert last(h.shipper).failure_cause == "kernel_start_failure"
    assert h.worker.progress.errors == {P.GENERATING: 1}


async def test_log_upload_unavailable_during_submitting_is_retried(
    make: Callable[..., Harness],
) -> None:
    """ManagerUnavailableError while SUBMITTING the logs is retried; the kernel ends TERMINATED."""
    h = make(FakeRuntime(exit_with=KernelExit(0)))
    h.shipper.upload_errors.append(unavailable())
    await h.run_to_running()
    await h.finished()

    assert h.shipper.statuses[-1] is K.TERMINATED
    assert h.worker.progress.errors == {P.SUBMITTING: 1}
    failed = [s for s in h.worker.progress.history if s.state is P.ERROR]
    assert [s.cause for s in failed] == [MANAGER_UNREACHABLE_CAUSE]
    assert h.shipper.logs() == {"stdout": b"hello\n", "stderr": b"warn\n"}  # sent exactly once
    assert h.sleep.delays.count(RETRY_DELAY_S) == 1


# -- stop requests ----------------------------------------------------------------------------


async def test_stop_while_waiting_for_run_ends_terminated_without_running(
    make: Callable[..., Harness],
) -> None:
    """STOP after PREPARED (before RUN): TERMINATING, TERMINATED; never RUNNING, never started."""
    h = make()
    await h.reported(K.PREPARED)
    h.desire(KernelIntent.STOP)
    await h.finished()

    assert h.shipper.statuses == [K.PULLING, K.PREPARED, K.TERMINATING, K.TERMINATED]
    assert h.runtime.start_calls == []
    # The staged kernel is given up: its processes never run the command.
    assert h.runtime.stage_calls == h.runtime.unstage_calls == [h.worker.kernel_id]
    assert h.worker.progress.state is P.USER_ABORT_COMPLETE


async def test_stop_while_running_terminates_once_and_reports_the_end(
    make: Callable[..., Harness],
) -> None:
    """STOP while RUNNING: terminate(stop_grace_s) once, then TERMINATING, TERMINATED."""
    h = make()
    await h.run_to_running()
    h.desire(KernelIntent.STOP)
    await h.finished()

    assert h.kernel.terminate_calls == [STOP_GRACE_S]
    assert h.shipper.statuses == [K.PULLING, K.PREPARED, K.RUNNING, K.TERMINATING, K.TERMINATED]
    assert last(h.shipper).exit_code == -15
    assert h.worker.progress.state is P.USER_ABORT_COMPLETE
    assert h.shipper.logs() == {"stdout": b"hello\n", "stderr": b"warn\n"}  # logs are kept


async def test_stop_during_a_stalled_preload_cancels_it(make: Callable[..., Harness]) -> None:
    """STOP while preload hangs: preload is cancelled, the kernel ends USER_ABORT_COMPLETE."""
    h = make(FakeRuntime(preload_gate=asyncio.Event()))  # never set
    await h.watch.until(lambda: len(h.runtime.preload_calls) == 1)
    h.desire(KernelIntent.STOP)
    await h.finished()

    assert h.runtime.preloads_cancelled == 1
    assert h.worker.progress.state is P.USER_ABORT_COMPLETE
    assert h.shipper.statuses == [K.PULLING, K.TERMINATING, K.TERMINATED]


async def test_a_stop_taken_back_before_the_worker_runs_starts_the_stage_over(
    make: Callable[..., Harness],
) -> None:
    """STOP cancels the stage in progress, but the latest desired state wins: a PREPARE that
    follows before the worker runs again starts the preload over, and the kernel gets PREPARED."""
    gate = asyncio.Event()
    h = make(FakeRuntime(preload_gate=gate))
    await h.watch.until(lambda: len(h.runtime.preload_calls) == 1)
    h.desire(KernelIntent.STOP)
    h.desire(KernelIntent.PREPARE)
    await h.watch.until(lambda: len(h.runtime.preload_calls) == 2)
    gate.set()
    await h.reported(K.PREPARED)

    assert h.runtime.preloads_cancelled == 1
    assert not h.worker.progress.terminal


async def test_a_stop_whose_stage_ends_anyway_is_honoured_at_the_next_stage(
    make: Callable[..., Harness],
) -> None:
    """A preload that finishes despite the STOP's cancellation: the stop is honoured before
    the next stage, and the worker's task is left with no cancellation pending."""
    h = make(FakeRuntime(preload_gate=asyncio.Event(), preload_swallows_cancel=True))
    await h.watch.until(lambda: len(h.runtime.preload_calls) == 1)
    h.desire(KernelIntent.STOP)
    await h.finished()

    assert h.runtime.preloads_cancelled == 1
    assert h.worker.progress.state is P.USER_ABORT_COMPLETE
    assert h.task.cancelling() == 0


async def test_cancelling_the_worker_while_a_stop_cancels_its_stage_cancels_the_worker(
    make: Callable[..., Harness],
) -> None:
    """A STOP and the worker's own cancellation at once: the worker is cancelled (the STOP's
    handling does not swallow the other cancellation), and it reports nothing more."""
    h = make(FakeRuntime(preload_gate=asyncio.Event()))
    await h.watch.until(lambda: len(h.runtime.preload_calls) == 1)
    reports_before = list(h.shipper.events)
    h.desire(KernelIntent.STOP)
    h.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.task

    assert h.runtime.preloads_cancelled == 1
    assert h.shipper.events == reports_before


async def test_stop_during_a_retry_backoff_ends_terminated(make: Callable[..., Harness]) -> None:
    """STOP while a failed preload waits out its retry delay still ends the kernel TERMINATED."""
    h = make(FakeRuntime(preload_failures=[PULL_FAILURE]), park=(LOG_INTERVAL_S, RETRY_DELAY_S))
    await h.watch.until(lambda: h.sleep.delays == [RETRY_DELAY_S])  # in ERROR, backing off
    h.desire(KernelIntent.STOP)
    await h.finished()

    assert h.worker.progress.terminal
    assert h.shipper.statuses[-1] is K.TERMINATED


# -- cancellation and agent shutdown ----------------------------------------------------------


async def test_cancelling_the_worker_kills_the_kernel_without_a_report(
    make: Callable[..., Harness],
) -> None:
    """Cancelled (the kernel left the assignment): the kernel is terminated, nothing reported."""
    h = make()
    await h.run_to_running()
    reports_before = list(h.shipper.events)
    h.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.task

    assert h.kernel.terminate_calls == [STOP_GRACE_S]
    assert h.shipper.events == reports_before


async def test_detached_worker_cancelled_leaves_the_kernel_running(
    make: Callable[..., Harness],
) -> None:
    """detach() then cancel (the agent's leave policy): no terminate, no report."""
    h = make()
    await h.run_to_running()
    reports_before = list(h.shipper.events)
    h.worker.detach()
    h.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.task

    assert h.kernel.terminate_calls == []
    assert not h.kernel.ended
    assert h.kernel.detached  # it stops watching too, for a later agent to adopt
    assert h.shipper.events == reports_before


async def test_shutdown_of_a_running_kernel_reports_error_agent_shutdown(
    make: Callable[..., Harness],
) -> None:
    """The agent stopping (cancel, then shutdown) ends a RUNNING kernel: ERROR agent_shutdown."""
    h = make()
    await h.run_to_running()
    h.task.cancel()  # as the daemon does: stop the worker's own run first
    await asyncio.gather(h.task, return_exceptions=True)
    await h.worker.shutdown("agent_shutdown")

    assert h.kernel.ended
    assert h.shipper.statuses == [K.PULLING, K.PREPARED, K.RUNNING, K.ERROR]
    assert last(h.shipper).failure_cause == "agent_shutdown"
    assert h.worker.done
    await h.worker.shutdown("agent_shutdown")  # a second call changes nothing
    assert len(h.shipper.reports) == 4


async def test_shutdown_of_a_finished_kernel_reports_nothing(make: Callable[..., Harness]) -> None:
    """shutdown() after the kernel ended on its own reports nothing more."""
    h = make(FakeRuntime(exit_with=KernelExit(0)))
    await h.run_to_running()
    await h.finished()
    reports_before = list(h.shipper.events)
    await h.worker.shutdown("agent_shutdown")

    assert h.shipper.events == reports_before


async def test_shutdown_during_a_retry_backoff_reports_error_agent_shutdown(
    make: Callable[..., Harness],
) -> None:
    """The agent stopping while a preload waits to be retried still reports ERROR agent_shutdown."""
    h = make(FakeRuntime(preload_failures=[PULL_FAILURE]), park=(LOG_INTERVAL_S, RETRY_DELAY_S))
    await h.watch.until(lambda: h.sleep.delays == [RETRY_DELAY_S])
    h.task.cancel()
    await asyncio.gather(h.task, return_exceptions=True)
    await h.worker.shutdown("agent_shutdown")

    assert h.shipper.statuses == [K.PULLING, K.ERROR]
    assert last(h.shipper).failure_cause == "agent_shutdown"


# -- log marks --------------------------------------------------------------------------------


def chunks(shipper: FakeShipper) -> list[tuple[str, int, bytes]]:
    """Every log chunk uploaded, in order: (stream, offset, bytes)."""
    uploads: list[list[LogChunkMessage]] = [item for kind, item in shipper.events if kind == "logs"]
    return [(c.stream, c.offset, c.raw()) for batch in uploads for c in batch]


async def test_log_marks_are_saved_before_each_upload(make: Callable[..., Harness]) -> None:
    """The kernel keeps what is being shipped before the upload: shipped, and up to where."""
    h = make(FakeRuntime(exit_with=KernelExit(0)))
    await h.run_to_running()
    await h.finished()

    assert h.kernel.saved_marks == [{"stdout": LogMark(0, 6), "stderr": LogMark(0, 5)}]
    assert h.shipper.index("logs") > 0


class GrowingLogShipper(FakeShipper):
    """Its first log upload gets no answer, and the kernel prints more meanwhile."""

    kernel: FakeKernel | None = None

    async def upload_logs(self, chunks: list[LogChunkMessage]) -> None:
        if self.kernel is not None:
            self.kernel.logs["stdout"] += b"more\n"
            self.kernel = None
            raise unavailable()
        await super().upload_logs(chunks)


async def test_an_unanswered_log_chunk_is_sent_again_exactly(make: Callable[..., Harness]) -> None:
    """The manager keeps the first chunk at an offset: a retry resends it, then what is new."""
    shipper = GrowingLogShipper()
    h = make(FakeRuntime(watch=shipper.watch, exit_with=KernelExit(0)), shipper=shipper)
    await h.run_to_running()
    shipper.kernel = h.kernel
    await h.finished()

    assert h.shipper.statuses[-1] is K.TERMINATED
    assert chunks(h.shipper) == [
        ("stdout", 0, b"hello\n"),
        ("stderr", 0, b"warn\n"),
        ("stdout", 6, b"more\n"),
    ]


# -- adopted kernels --------------------------------------------------------------------------


def adopting(kernel: FakeKernel) -> Callable[[], Awaitable[RunningKernel]]:
    """An `adopt` that hands the worker `kernel`."""

    async def adopt() -> RunningKernel:
        return kernel

    return adopt


def left_kernel(
    runtime: FakeRuntime, *, marks: dict[str, LogMark] | None = None, logs: dict[str, bytes]
) -> FakeKernel:
    """A kernel an earlier agent started, still running, its logs shipped up to `marks`."""
    kernel = FakeKernel(runtime.watch, runtime.info, logs, {}, None)
    kernel.log_marks = dict(marks or {})
    runtime.kernels[KID] = kernel
    return kernel


async def test_an_adopted_kernel_is_supervised_without_being_started_or_reported_started(
    make: Callable[..., Harness],
) -> None:
    """Adopted while RUNNING: no preload, no start, no report until it ends (exit 3: ERROR)."""
    runtime = FakeRuntime()
    adopted = left_kernel(runtime, logs={})
    h = make(
        runtime,
        kernel=assigned(status=K.RUNNING, desired=KernelIntent.RUN),
        adopt=adopting(adopted),
    )
    await h.watch.until(lambda: states(h.worker) == [P.NOT_STARTED, P.GENERATING])
    assert h.shipper.events == []
    adopted.exit(KernelExit(3))
    await h.finished()

    assert runtime.preload_calls == runtime.start_calls == []
    assert h.shipper.statuses == [K.TERMINATING, K.ERROR]
    assert (last(h.shipper).failure_cause, last(h.shipper).exit_code) == (NONZERO_EXIT_CAUSE, 3)


async def test_an_adopted_kernel_ships_logs_from_its_marks(make: Callable[..., Harness]) -> None:
    """Shipped bytes are not sent again; the chunk whose upload got no answer is, exactly."""
    runtime = FakeRuntime(exit_with=KernelExit(0))
    logs = {"stdout": b"0123456789abc", "stderr": b"warn\nlater\n"}
    marks = {"stdout": LogMark(4, 8), "stderr": LogMark(5, 5)}
    adopted = left_kernel(runtime, marks=marks, logs=logs)
    adopted.exit(KernelExit(0))
    h = make(
        runtime,
        kernel=assigned(status=K.RUNNING, desired=KernelIntent.RUN),
        adopt=adopting(adopted),
    )
    await h.finished()

    assert h.shipper.statuses == [K.TERMINATING, K.TERMINATED]
    assert chunks(h.shipper) == [
        ("stdout", 4, b"4567"),
        ("stderr", 5, b"later\n"),
        ("stdout", 8, b"89abc"),
    ]


async def test_an_adopted_kernel_that_was_lost_ends_in_error_without_an_exit_code(
    make: Callable[..., Harness],
) -> None:
    """An adopted kernel ending without a known status: ERROR kernel_lost, no exit code."""
    runtime = FakeRuntime()
    adopted = left_kernel(runtime, logs={})
    adopted.exit(KernelExit(None, KERNEL_LOST_CAUSE, "gone"))
    h = make(
        runtime,
        kernel=assigned(status=K.TERMINATING, desired=KernelIntent.RUN),
        adopt=adopting(adopted),
    )
    await h.finished()

    assert h.shipper.statuses == [K.ERROR]
    error = last(h.shipper)
    assert (error.failure_cause, error.exit_code, error.message) == (
        KERNEL_LOST_CAUSE,
        None,
        "gone",
    )


async def test_an_adopted_kernel_asked_to_stop_is_terminated(make: Callable[..., Harness]) -> None:
    """Adopted with STOP desired (the manager ended it while no agent ran): terminated once."""
    runtime = FakeRuntime()
    adopted = left_kernel(runtime, logs={})
    h = make(
        runtime,
        kernel=assigned(status=K.RUNNING, desired=KernelIntent.STOP),
        adopt=adopting(adopted),
    )
    await h.finished()

    assert adopted.terminate_calls == [STOP_GRACE_S]
    assert h.shipper.statuses == [K.TERMINATING, K.TERMINATED]
