"""One kernel on an agent: driven through the progress machine, its runtime doing each stage.

PREPARE: PRELOADING (the runtime resolves the image, makes the directories) → PRELOADING_COMPLETE.
RUN: GENERATING (the runtime starts the kernel) until it exits or the manager asks it to stop.
After an exit: post-processing (final logs, the output list), the safety check (output size
limit), submitting (logs and outputs uploaded), then COMPLETE — or, for a non-zero exit or an
out-of-memory kill, ABORTED → REPORTED_FAILED, so the kernel ends in ERROR with that cause.
A stop request during any stage is honoured (USER_REQUESTED_ABORT → USER_ABORT_COMPLETE).
A worker given `adopt` takes over a kernel an earlier agent started and left running: it goes
straight to GENERATING without reporting, and supervises the adopted kernel like its own.

The restart policy (`domain.restarts`): a kernel whose process exits non-zero while RUNNING,
with restarts left under its session's `restart_limit`, goes GENERATING → ERROR → GENERATING
(the progress machine's own retry edge; GENERATING's error limit is raised by the restart
limit) and is started again here, its logs continued. Both halves are reported (RUNNING with
`restarts`, `restarting` then not), and the runtime records which restart it started, so an
adopting agent counts on from there and never starts one twice.

A failed stage goes to ERROR and back to the same stage while the machine's per-state error
limit allows, after a backoff; past the limit, or for a failure retrying cannot fix, the kernel
is aborted and reported failed with the stage's cause. Every move is reported through the one
table `progress.KERNEL_STATUS`, skipping statuses the kernel table does not allow from the last
one reported (a kernel prepared again after an agent restart does not report PULLING twice).

Logs are shipped from where the last upload ended, and the runtime keeps that mark with the
kernel (`save_log_marks`) before each upload, so an adopting agent neither resends what arrived
nor skips what did not. A chunk whose upload got no answer is sent again exactly as it was: the
manager keeps the first chunk stored at an offset (see `LogMark`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any, NoReturn, Protocol, TypeVar

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.agent.progress import DEFAULT_ERROR_LIMITS, KERNEL_STATUS, KernelProgress, Progress
from corral.agent.protocol import (
    AssignedKernelMessage,
    KernelReportMessage,
    LogChunkMessage,
    OutputMessage,
    encode_bytes,
)
from corral.agent.runtime import (
    KERNEL_LOST_CAUSE,
    LOG_STREAMS,
    KernelExit,
    KernelLaunch,
    LogMark,
    RunningKernel,
    Runtime,
    StageFailure,
)
from corral.agent.uploads import unpack_upload
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.session import KernelIntent
from corral.domain.status import KERNEL_TRANSITIONS, KernelStatus
from corral.domain.types import Clock, utcnow

logger = logging.getLogger(__name__)

P = Progress
_T = TypeVar("_T")

NONZERO_EXIT_CAUSE = FailureCause.KERNEL_NONZERO_EXIT
OUTPUT_TOO_LARGE_CAUSE = FailureCause.OUTPUT_TOO_LARGE
MANAGER_UNREACHABLE_CAUSE = FailureCause.MANAGER_UNREACHABLE
MANAGER_REFUSED_CAUSE = FailureCause.MANAGER_REFUSED
AGENT_IO_CAUSE = FailureCause.AGENT_IO_ERROR
LOG_READ_BYTES = 256 * 1024
STOP_GRACE_S = 10.0  # a stopped kernel: SIGTERM, then SIGKILL this much later

# The post-run stages, in order, per mode (black box: the runtime collects outputs itself).
_POST_RUN = (
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
)
_POST_RUN_BLACK_BOX = (
    P.PENDING_SAFETY_CHECK,
    P.SAFETY_CHECKING,
    P.PENDING_SUBMIT,
    P.SUBMITTING,
    P.SUBMIT_COMPLETE,
)


class Shipper(Protocol):
    """What a worker needs from its agent to reach the manager."""

    def report(self, report: KernelReportMessage) -> None:
        """Queue a report; it is sent in order, in a batch, retried until it is delivered."""
        ...

    async def upload_logs(self, chunks: list[LogChunkMessage]) -> None:
        """Upload now (raises ManagerUnavailableError when the manager cannot be reached)."""
        ...

    async def upload_outputs(self, outputs: list[OutputMessage]) -> None:
        """Upload now (raises ManagerUnavailableError when the manager cannot be reached)."""
        ...

    async def fetch_upload(self, kernel_id: uuid.UUID) -> bytes:
        """The kernel's upload (raises ManagerUnavailableError when it cannot be reached)."""
        ...


@record
class WorkerSettings:
    """How a worker paces itself."""

    stop_grace_s: float = STOP_GRACE_S  # SIGTERM → SIGKILL
    log_interval_s: float = 1.0  # how often a running kernel's new log bytes are shipped
    retry_delay_s: float = 0.2  # first backoff after a failed stage; doubles, capped
    retry_delay_cap_s: float = 5.0
    max_output_bytes: int = 64 * 1024 * 1024
    ship_logs: bool = True


class _Ended(Exception):
    """The kernel reached a terminal progress state; the worker is done."""


class _StopRequested(Exception):
    """The manager asked for the kernel to stop while a stage was in progress."""


class KernelWorker:
    """Drives one assigned kernel to a terminal state; `update` feeds it newer assignments."""

    def __init__(
        self,
        kernel: AssignedKernelMessage,
        launch: KernelLaunch,
        runtime: Runtime,
        shipper: Shipper,
        *,
        settings: WorkerSettings = WorkerSettings(),
        clock: Clock = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        adopt: Callable[[], Awaitable[RunningKernel]] | None = None,
    ) -> None:
        self.kernel_id = kernel.id
        self.attempt = kernel.attempt  # the placement this worker runs; its reports name it
        self.launch = launch
        # The restart policy: restarts allowed in all, and made so far (the manager's count).
        self.restart_limit = int(kernel.spec.get("restart_limit") or 0)
        self.restarts = kernel.restarts
        # Restarts made for certain: one the manager heard announced (`restarting`) may not
        # have started before its agent died (an adopting worker counts by the runtime's record).
        self._restarts_started = kernel.restarts - (1 if kernel.restarting else 0)
        limits = None
        if self.restart_limit:
            # Each restart is one failure of GENERATING: the limit makes room for them all.
            limits = {P.GENERATING: DEFAULT_ERROR_LIMITS[P.GENERATING] + self.restart_limit}
        self.progress = KernelProgress(
            black_box=runtime.black_box, clock=clock, error_limits=limits
        )
        self._runtime = runtime
        self._shipper = shipper
        self._settings = settings
        self._sleep = sleep
        self._desired = kernel.desired_state
        self._changed = asyncio.Event()
        self._stage: asyncio.Task[Any] | None = None  # this worker's task while in a stage
        self._stage_stopped = False  # `update()` cancelled that stage for a STOP
        self._reported: KernelStatus = kernel.status
        self._running: RunningKernel | None = None
        # The runtime getting the kernel ready to start (`Runtime.stage`), once it is prepared.
        self._staging: asyncio.Task[None] | None = None
        self._adopt = adopt  # set: the kernel runs already, started by an earlier agent
        self._log_offsets = dict.fromkeys(LOG_STREAMS, 0)  # shipped up to here, per stream
        self._log_resend: dict[str, int] = {}  # a chunk sent without an answer: where it ended
        self._detached = False
        self._exit_code: int | None = None  # once the kernel's process ended
        # The last status report queued: once done, the kernel's end, sent again if the
        # manager still believes the kernel live (its earlier delivery was refused or lost).
        self.last_report: KernelReportMessage | None = None

    @property
    def done(self) -> bool:
        """The kernel reached a terminal progress state."""
        return self.progress.terminal

    def status_report(self) -> KernelReportMessage:
        """The kernel's status as this worker last reported it (or the manager moved it to)."""
        return KernelReportMessage(
            kernel_id=self.kernel_id, status=self._reported, attempt=self.attempt
        )

    def detach(self) -> None:
        """Leave the kernel running when the worker is cancelled (the agent's `leave` policy)."""
        self._detached = True

    def update(self, kernel: AssignedKernelMessage) -> None:
        """A newer assignment of this kernel (its desired state may have changed)."""
        if kernel.status is not self._reported and KERNEL_TRANSITIONS.allowed(
            self._reported, kernel.status
        ):
            # The manager moved the kernel on (PREPARED → CREATING when it asked for RUN):
            # the next report starts from there.
            self._reported = kernel.status
        if kernel.desired_state != self._desired:
            self._desired = kernel.desired_state
            self._changed.set()
            if self._desired is KernelIntent.STOP and self._stage is not None:
                self._stage_stopped = True
                self._stage.cancel()

    async def run(self) -> None:
        """Drive the kernel until it ends; cancelled: kill it without reporting (not ours now)."""
        try:
            if self._adopt is not None:
                running = await self._take_over(self._adopt)
            else:
                await self._prepare()
                await self._until_desired({KernelIntent.RUN})
                running = await self._start()
            await self._supervise(running)
        except _StopRequested:
            await self._stop_now()
        except _Ended:
            pass
        except asyncio.CancelledError:
            if not self._detached:
                await asyncio.shield(self._kill_quietly())
            elif self._running is not None:
                self._running.detach()
            raise
        finally:
            if self._adopt is None and self._runtime.stages:
                await asyncio.shield(self._unstage())

    async def kill_now(self) -> None:
        """Cut short a stop in progress: SIGKILL the kernel now instead of at the end of its
        grace period (the stop then completes as it would have)."""
        if self._running is not None and not self.progress.terminal:
            with contextlib.suppress(Exception):
                await self._running.terminate(0)

    async def shutdown(self, cause: str) -> None:
        """The agent is stopping: end the kernel now and report it failed with `cause`."""
        if self.progress.terminal:
            return
        await self._kill_quietly()
        if self.progress.state is P.USER_REQUESTED_ABORT:
            # Asked to stop anyway: the shutdown completes that abort.
            self._move(P.USER_ABORT_COMPLETE, message="stopped as the agent shut down")
            return
        with contextlib.suppress(_Ended):
            self._fail(cause, "the agent shut down", exit_code=self._exit_code)

    # -- stages ---------------------------------------------------------------------------

    async def _prepare(self) -> None:
        if self.progress.black_box:
            await self._attempt(self._preload)
            self._emit(KernelStatus.PREPARED)
            return
        self._move(P.PRELOADING)
        await self._attempt(self._preload)
        self._move(P.PRELOADING_COMPLETE)
        if self._runtime.stages:
            # Reported first: the runtime gets the start ready while the manager moves on.
            self._staging = asyncio.create_task(
                self._runtime.stage(self.launch), name=f"kernel-{self.kernel_id}-stage"
            )

    async def _preload(self) -> None:
        """The runtime's preload, then the session's upload unpacked (only if it names one)."""
        await self._runtime.preload(self.launch)
        if self.launch.upload is not None:
            data = await self._shipper.fetch_upload(self.kernel_id)
            await asyncio.to_thread(unpack_upload, data, self.launch.upload_dir)

    async def _start(self) -> RunningKernel:
        self._move(P.GENERATING, report=False)
        running = await self._attempt(self._start_staged)
        self._running = running
        self._emit(KernelStatus.RUNNING, runtime_info=dict(running.info))
        return running

    async def _start_staged(self) -> RunningKernel:
        """The runtime's start, once its staging (if any) is over, whichever way it ended."""
        if self._staging is not None:
            await asyncio.wait({self._staging})
        return await self._runtime.start(self.launch)

    async def _unstage(self) -> None:
        """The worker ends: a kernel preloaded or staged and never started is given up
        (`Runtime.unstage`; nothing when it was started)."""
        staging = self._staging
        if staging is not None:
            staging.cancel()
            await asyncio.wait({staging})
            if not staging.cancelled() and staging.exception() is not None:
                extra = {"kernel_id": str(self.kernel_id)}
                logger.error("kernel.stage_crashed", extra=extra, exc_info=staging.exception())
        try:
            await self._runtime.unstage(self.launch)
        except Exception:  # the worker is ending: say so, never hide how it ended
            logger.exception("kernel.unstage_failed", extra={"kernel_id": str(self.kernel_id)})

    async def _take_over(self, adopt: Callable[[], Awaitable[RunningKernel]]) -> RunningKernel:
        """Adopt a kernel an earlier agent started: it is past preparing and start already."""
        self._move(P.GENERATING, report=False)
        try:
            # Not interruptible, unlike a start: the kernel runs already, so a STOP that came
            # meanwhile is for the supervision that follows to honour.
            running = await adopt()
        except OSError as exc:
            self._fail(AGENT_IO_CAUSE, f"cannot adopt the kernel: {type(exc).__name__}: {exc}")
        self._running = running
        for stream, mark in running.log_marks.items():
            self._log_offsets[stream] = mark.shipped
            if mark.sending > mark.shipped:
                self._log_resend[stream] = mark.sending
        # The earlier agent's RUNNING report may not have arrived (the manager says CREATING).
        self._emit(KernelStatus.RUNNING, runtime_info=dict(running.info))
        # Count on from the restarts that started: the runtime's record says which run this is
        # (an announced restart the earlier agent died before starting is started anew, once);
        # a restart running on is reported running (acknowledged if that report arrived).
        restart = int(running.info.get("restart") or 0)
        self.restarts = max(restart, self._restarts_started)
        if restart and restart == self.restarts:
            self._report_restart(restarting=False, runtime_info=dict(running.info))
        return running

    async def _supervise(self, running: RunningKernel) -> None:
        while True:
            ended = await self._watch(running)
            if not self._restartable(ended):
                break
            running = await self._restart(ended)
        await self._after_exit(ended)

    def _restartable(self, exit: KernelExit) -> bool:
        """Whether the restart policy starts the kernel again after `exit`: it exited non-zero
        (not lost) while GENERATING, with restarts and GENERATING attempts left."""
        if exit.exit_code in (None, 0) or exit.failure_cause == KERNEL_LOST_CAUSE:
            return False
        if self.restarts >= self.restart_limit or self.progress.state is not P.GENERATING:
            return False
        failed = self.progress.errors.get(P.GENERATING, 0) + 1  # counting this exit
        return failed < self.progress.error_limits[P.GENERATING]

    async def _restart(self, exit: KernelExit) -> RunningKernel:
        """Start the kernel again after a non-zero exit: ERROR → GENERATING, reported twice."""
        self._exit_code = exit.exit_code
        cause = exit.failure_cause or NONZERO_EXIT_CAUSE
        message = exit.message or f"the kernel exited with code {exit.exit_code}"
        self.progress.fail(cause, message)
        self.restarts += 1
        await self._salvage_logs()
        self._report_restart(
            restarting=True,
            exit_code=exit.exit_code,
            failure_cause=cause,
            message=f"{message}; restart {self.restarts} of {self.restart_limit}",
        )
        logger.info(
            "kernel.restarting",
            extra={
                "kernel_id": str(self.kernel_id),
                "restart": self.restarts,
                "limit": self.restart_limit,
                "exit_code": exit.exit_code,
            },
        )
        failures = self.progress.errors.get(P.GENERATING, 1)
        delay = self._settings.retry_delay_s * 2 ** min(failures - 1, 16)
        await self._interruptible(
            functools.partial(self._sleep, min(delay, self._settings.retry_delay_cap_s))
        )
        self.progress.retry()  # ERROR → GENERATING
        self.launch = dataclasses.replace(self.launch, restart=self.restarts)
        launch = self.launch
        running = await self._attempt(lambda: self._runtime.start(launch))
        self._running = running
        self._exit_code = None
        # Its logs continue the earlier run's: an adopting agent ships on from here.
        with contextlib.suppress(OSError):
            await running.save_log_marks(
                {s: LogMark(offset, offset) for s, offset in self._log_offsets.items()}
            )
        self._report_restart(restarting=False, runtime_info=dict(running.info))
        return running

    def _report_restart(self, *, restarting: bool, **fields: Any) -> None:
        """Report the kernel's current restart: under way (`restarting`) or running again."""
        self._shipper.report(
            KernelReportMessage(
                kernel_id=self.kernel_id,
                status=KernelStatus.RUNNING,
                attempt=self.attempt,
                restarts=self.restarts,
                restarting=restarting,
                **fields,
            )
        )

    async def _watch(self, running: RunningKernel) -> KernelExit:
        """Until the kernel's process ends (its logs shipped meanwhile); how it ended."""
        # No log pump when logs are not shipped (`corral simulate`: a task and a timer less
        # for each of its kernels).
        pump = (
            asyncio.create_task(self._pump_logs(), name=f"kernel-{self.kernel_id}-logs")
            if self._settings.ship_logs
            else None
        )
        try:
            # Stopped or cancelled, the wait is cancelled: terminate() reports how it ended.
            ended = await self._interruptible(running.wait)
        finally:
            if pump is not None:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
        return ended

    async def _after_exit(self, exit: KernelExit) -> None:
        self._exit_code = exit.exit_code
        collected: list[list[OutputMessage]] = [[]]  # the latest collection, for the stages

        async def collect() -> None:
            collected[0] = await self._collect_outputs()

        steps = _POST_RUN_BLACK_BOX if self.progress.black_box else _POST_RUN
        for state in steps:
            self._move(state, exit_code=exit.exit_code)
            if state is P.POST_PROCESSING:
                await self._attempt(collect)
            elif state is P.SAFETY_CHECKING:
                if self.progress.black_box:
                    await self._attempt(collect)
                await self._attempt(lambda: self._check_outputs(collected[0]))
            elif state is P.SUBMITTING:
                await self._attempt(lambda: self._submit(collected[0]))
        cause = exit.failure_cause or (NONZERO_EXIT_CAUSE if exit.exit_code != 0 else None)
        if cause is None:
            self._move(P.COMPLETE, exit_code=exit.exit_code)
            return
        message = exit.message or f"the kernel exited with code {exit.exit_code}"
        self._fail(cause, message, exit_code=exit.exit_code)

    async def _stop_now(self) -> None:
        """Honour a stop request: end whatever runs, keep its logs, report how it ended."""
        if self.progress.terminal:
            return
        if self.progress.state is P.ERROR:
            # ERROR may only go back to its stage or to ABORTED: the abort the user asked
            # for goes through ABORTED (spec document 3: ABORTED → USER_REQUESTED_ABORT).
            self.progress.abort("user_requested_abort", "stopped while a stage was failing")
        if self.progress.state is not P.USER_REQUESTED_ABORT:
            self._move(P.USER_REQUESTED_ABORT)
        exit_code = None
        if self._running is not None:
            ended = await self._running.terminate(self._settings.stop_grace_s)
            exit_code = ended.exit_code
            with contextlib.suppress(ManagerUnavailableError):
                await self._ship_new_logs()
        self._move(P.USER_ABORT_COMPLETE, exit_code=exit_code, message="stopped on request")

    # -- work of the stages ---------------------------------------------------------------

    async def _collect_outputs(self) -> list[OutputMessage]:
        assert self._running is not None
        files = await self._running.list_outputs()
        return [
            OutputMessage(
                kernel_id=self.kernel_id,
                name=f.name,
                data=encode_bytes(await self._running.read_output(f.name)),
            )
            for f in files
        ]

    async def _check_outputs(self, outputs: list[OutputMessage]) -> None:
        total = sum(len(o.raw()) for o in outputs)
        if total > self._settings.max_output_bytes:
            raise StageFailure(
                OUTPUT_TOO_LARGE_CAUSE,
                f"outputs hold {total} bytes, over the agent's limit of "
                f"{self._settings.max_output_bytes}",
                retryable=False,
            )

    async def _submit(self, outputs: list[OutputMessage]) -> None:
        await self._ship_new_logs()
        if outputs:
            await self._shipper.upload_outputs(outputs)

    async def _pump_logs(self) -> None:
        """Ship a running kernel's new log bytes every log interval (best effort)."""
        while True:
            await self._sleep(self._settings.log_interval_s)
            try:
                await self._ship_new_logs()
            except ManagerUnavailableError:
                continue  # the final submit ships them; nothing is lost, offsets did not move

    async def _ship_new_logs(self) -> None:
        if self._running is None or not self._settings.ship_logs:
            return
        while True:
            chunks, marks = [], {}
            for stream in LOG_STREAMS:
                offset = self._log_offsets[stream]
                limit = self._log_resend.get(stream, offset + LOG_READ_BYTES) - offset
                data = await self._running.read_log(stream, offset, limit)
                marks[stream] = LogMark(offset, offset + len(data))
                if data:
                    chunks.append(
                        LogChunkMessage(
                            kernel_id=self.kernel_id,
                            stream=stream,
                            offset=offset,
                            data=encode_bytes(data),
                        )
                    )
            if not chunks:
                return
            # Kept before the upload: if no answer comes, this agent or an adopting one sends
            # exactly these chunks again.
            self._log_resend = {s: m.sending for s, m in marks.items() if m.sending > m.shipped}
            await self._running.save_log_marks(marks)
            await self._shipper.upload_logs(chunks)
            self._log_resend = {}
            for chunk in chunks:
                self._log_offsets[chunk.stream] += len(chunk.raw())

    # -- the machine ----------------------------------------------------------------------

    async def _attempt(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Do a stage's work; on failure retry within the state's error limit, else fail."""
        while True:
            try:
                return await self._interruptible(work)
            except StageFailure as failure:
                cause, message, retryable = failure.cause, failure.message, failure.retryable
            except ManagerUnavailableError as exc:
                cause, message, retryable = MANAGER_UNREACHABLE_CAUSE, str(exc), True
            except ManagerRejectedError as exc:
                cause, message, retryable = MANAGER_REFUSED_CAUSE, str(exc), False
            except OSError as exc:
                cause, message, retryable = AGENT_IO_CAUSE, f"{type(exc).__name__}: {exc}", True
            stage = self.progress.state
            self.progress.fail(cause, message)
            logger.warning(
                "kernel.stage_failed",
                extra={"kernel_id": str(self.kernel_id), "stage": stage.value, "cause": cause},
            )
            if not (retryable and self.progress.can_retry()):
                await self._salvage_logs()
                self._fail(cause, message, exit_code=self._exit_code)
            failures = self.progress.errors.get(stage, 1)
            delay = self._settings.retry_delay_s * 2 ** min(failures - 1, 16)
            delay = min(delay, self._settings.retry_delay_cap_s)
            await self._interruptible(functools.partial(self._sleep, delay))
            self.progress.retry()

    async def _salvage_logs(self) -> None:
        """Before reporting a failure, ship what the kernel printed (best effort)."""
        with contextlib.suppress(ManagerUnavailableError, ManagerRejectedError, OSError):
            await self._ship_new_logs()

    async def _interruptible(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Await `work()`, unless the manager asks the kernel to stop first (it is cancelled).

        The stage runs in this worker's own task, which `update()` cancels when STOP arrives
        and this method uncancels; a cancellation from anywhere else propagates. A stage has
        no task of its own: six tasks a kernel fewer, and stages that do not wait (simulated,
        zero latency) run one after the other in one step of the event loop. If the manager
        takes the STOP back before this worker runs again, the latest desired state wins: the
        stage starts over.
        """
        task = asyncio.current_task()
        assert task is not None
        while True:
            if self._stop_asked():
                raise _StopRequested
            self._stage, self._stage_stopped = task, False
            try:
                result = await work()
                if self._stage_stopped:
                    task.uncancel()  # the stage swallowed the STOP's cancellation and ended
                return result
            except asyncio.CancelledError:
                if not self._stage_stopped or task.uncancel() > 0:
                    raise  # this worker itself is being cancelled
                # update() cancelled the stage for a STOP: stop, or start over if taken back.
            except Exception:
                if self._stop_asked():
                    raise _StopRequested from None  # it failed while being stopped
                raise
            finally:
                self._stage = None

    def _stop_asked(self) -> bool:
        # A method, not an inline test: `update()` changes `_desired` while a stage is awaited.
        return self._desired is KernelIntent.STOP

    async def _until_desired(self, wanted: Collection[KernelIntent]) -> None:
        while self._desired not in wanted:
            if self._desired is KernelIntent.STOP:
                raise _StopRequested
            await self._changed.wait()
            self._changed.clear()

    def _fail(self, cause: str, message: str, *, exit_code: int | None = None) -> NoReturn:
        """Abort the kernel and report it failed with `cause`; always raises _Ended."""
        if self.progress.state is not P.ABORTED:
            self.progress.abort(cause, message)
        self._move(P.REPORTED_FAILED, exit_code=exit_code, failure_cause=cause, message=message)
        logger.info(
            "kernel.failed",
            extra={"kernel_id": str(self.kernel_id), "cause": cause, "exit_code": exit_code},
        )
        raise _Ended

    def _move(self, to: Progress, *, report: bool = True, **fields: Any) -> None:
        if to is P.USER_REQUESTED_ABORT:
            self.progress.user_abort()
        else:
            self.progress.advance(to)
        status = KERNEL_STATUS[to]
        if report and status is not None:
            self._emit(status, **fields)

    def _emit(self, status: KernelStatus, **fields: Any) -> None:
        """Report `status` unless already reported or not a move the kernel table allows."""
        if status is self._reported or not KERNEL_TRANSITIONS.allowed(self._reported, status):
            return
        report = KernelReportMessage(
            kernel_id=self.kernel_id, status=status, attempt=self.attempt, **fields
        )
        self._shipper.report(report)
        self.last_report = report
        self._reported = status

    async def _kill_quietly(self) -> None:
        if self._running is not None:
            with contextlib.suppress(Exception):
                await self._running.terminate(self._settings.stop_grace_s)
