"""In-memory fakes of the agent's interfaces: the manager client, a shipper, a runtime, sleep.

Every fake notifies a shared `Watch` when it records something, so a test awaits a condition
(`await watch.until(lambda: ...)`) instead of polling or sleeping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import (
    AssignedKernelMessage,
    AssignmentMessage,
    HeartbeatResponse,
    KernelReportMessage,
    LogChunkMessage,
    OutputMessage,
    RegisterRequest,
    RegisterResponse,
    ReportAccepted,
)
from corral.agent.runtime import KernelExit, KernelLaunch, LogMark, OutputFile, StageFailure
from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus
from corral.domain.types import KernelId, SessionId

KID = KernelId(uuid.UUID(int=1))
SESSION_ID = SessionId(uuid.UUID(int=100))
WATCH_TIMEOUT_S = 2.0  # a safety net: a condition never met fails the test instead of hanging
TERMINATED_EXIT = KernelExit(-15, None, "fake: terminated")


def kernel_id(n: int) -> KernelId:
    """A readable, stable kernel id."""
    return KernelId(uuid.UUID(int=n))


def assigned(
    kid: uuid.UUID = KID,
    *,
    status: KernelStatus = KernelStatus.PREPARING,
    desired: KernelIntent | None = KernelIntent.PREPARE,
    slots: Mapping[str, int] | None = None,
    attempt: int = 1,
    asked: bool = False,
    restart_limit: int = 0,
    restarts: int = 0,
    restarting: bool = False,
) -> AssignedKernelMessage:
    """One kernel as an assignment carries it."""
    return AssignedKernelMessage(
        id=kid,
        session_id=SESSION_ID,
        cluster_role="main",
        cluster_index=0,
        cluster_size=1,
        cluster_hosts=["10.0.0.1:7000"],
        status=status,
        desired_state=desired,
        desired_generation=1,
        stage_failure=None,
        attempt=attempt,
        asked=asked,
        restarts=restarts,
        restarting=restarting,
        slots=dict(slots or {"cpu": 1000}),
        spec={
            "type": "BATCH",
            "image": "python:3.11",
            "command": ["python", "-c", "pass"],
            **({"restart_limit": restart_limit} if restart_limit else {}),
        },
    )


def assignment(revision: int, *kernels: AssignedKernelMessage) -> AssignmentMessage:
    """An agent's full desired state."""
    return AssignmentMessage(agent_id="agent-1", revision=revision, kernels=list(kernels))


def launch_of(kernel: AssignedKernelMessage, work_dir: Path = Path("/nonexistent")) -> KernelLaunch:
    """The launch a worker is given for `kernel` (the fakes never touch `work_dir`)."""
    return KernelLaunch(
        kernel_id=KernelId(kernel.id),
        session_id=SessionId(kernel.session_id),
        session_type="BATCH",
        image="python:3.11",
        command=("python",),
        env={},
        cluster_size=1,
        cluster_rank=0,
        cluster_role="main",
        cluster_hosts=("10.0.0.1",),
        slots=kernel.slots,
        work_dir=work_dir,
    )


class Watch:
    """Wakes waiters when a condition over the fakes' records becomes true (no polling)."""

    def __init__(self) -> None:
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def changed(self) -> None:
        """Something was recorded: resolve every waiter whose condition now holds."""
        for predicate, future in self._waiters:
            if not future.done() and predicate():
                future.set_result(None)
        self._waiters = [(p, f) for p, f in self._waiters if not f.done()]

    async def until(
        self, predicate: Callable[[], bool], timeout_s: float = WATCH_TIMEOUT_S
    ) -> None:
        """Return once `predicate()` holds; fail the test if it does not within `timeout_s`."""
        if predicate():
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        try:
            async with asyncio.timeout(timeout_s):
                await future
        except TimeoutError:
            raise AssertionError(f"condition still false after {timeout_s} s") from None


class FakeSleep:
    """An injected sleep: records each delay, returns at once, or never for a `park` delay."""

    def __init__(self, *, park: Iterable[float] = (), watch: Watch | None = None) -> None:
        self.delays: list[float] = []
        self.park = set(park)  # delays that stand for "a loop waiting for time that never comes"
        self.watch = watch or Watch()

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        self.watch.changed()
        if delay_s in self.park:
            await asyncio.get_running_loop().create_future()
        await asyncio.sleep(0)


class FakeShipper:
    """A worker's shipper: records reports, log and output uploads in one ordered list."""

    def __init__(self, watch: Watch | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.upload_errors: deque[BaseException] = deque()  # raised by the next uploads
        self.uploads: dict[uuid.UUID, bytes] = {}  # what fetch_upload answers, per kernel
        self.watch = watch or Watch()

    def report(self, report: KernelReportMessage) -> None:
        self.events.append(("report", report))
        self.watch.changed()

    async def upload_logs(self, chunks: list[LogChunkMessage]) -> None:
        self._maybe_fail()
        self.events.append(("logs", list(chunks)))
        self.watch.changed()

    async def upload_outputs(self, outputs: list[OutputMessage]) -> None:
        self._maybe_fail()
        self.events.append(("outputs", list(outputs)))
        self.watch.changed()

    async def fetch_upload(self, kernel_id: uuid.UUID) -> bytes:
        self._maybe_fail()
        self.events.append(("fetch_upload", kernel_id))
        return self.uploads[kernel_id]

    @property
    def reports(self) -> list[KernelReportMessage]:
        return [item for kind, item in self.events if kind == "report"]

    @property
    def statuses(self) -> list[KernelStatus]:
        return [r.status for r in self.reports]

    def logs(self) -> dict[str, bytes]:
        """Every uploaded log byte per stream, in upload order."""
        streams: dict[str, bytes] = {}
        for kind, chunks in self.events:
            if kind == "logs":
                for chunk in chunks:
                    streams[chunk.stream] = streams.get(chunk.stream, b"") + chunk.raw()
        return streams

    def index(self, kind: str, predicate: Callable[[Any], bool] = lambda _: True) -> int:
        """Position of the first event of `kind` matching `predicate` (ValueError if none)."""
        for position, (event_kind, item) in enumerate(self.events):
            if event_kind == kind and predicate(item):
                return position
        raise ValueError(f"no {kind} event matches")

    def _maybe_fail(self) -> None:
        if self.upload_errors:
            raise self.upload_errors.popleft()


class FakeKernel:
    """A started kernel: runs until `exit()` or `terminate()`; records terminate calls."""

    def __init__(
        self,
        watch: Watch,
        info: Mapping[str, Any],
        logs: Mapping[str, bytes],
        outputs: Mapping[str, bytes],
        exit_with: KernelExit | None,
    ) -> None:
        self._watch = watch
        self._info = dict(info)
        self.logs = dict(logs)
        self.outputs = dict(outputs)
        self.terminate_calls: list[float] = []
        self.log_marks: dict[str, LogMark] = {}  # as last saved (or as handed over)
        self.saved_marks: list[dict[str, LogMark]] = []
        self.detached = False
        self._ended: asyncio.Future[KernelExit] = asyncio.get_running_loop().create_future()
        if exit_with is not None:
            self._ended.set_result(exit_with)

    @property
    def info(self) -> Mapping[str, Any]:
        return self._info

    @property
    def ended(self) -> bool:
        return self._ended.done()

    def exit(self, outcome: KernelExit) -> None:
        """The kernel ends by itself with `outcome` (ignored once it ended)."""
        if not self._ended.done():
            self._ended.set_result(outcome)
            self._watch.changed()

    async def wait(self) -> KernelExit:
        return await asyncio.shield(self._ended)

    async def terminate(self, grace_s: float) -> KernelExit:
        self.terminate_calls.append(grace_s)
        self.exit(TERMINATED_EXIT)
        self._watch.changed()
        return await self.wait()

    async def read_log(self, stream: str, offset: int, limit: int) -> bytes:
        return self.logs.get(stream, b"")[offset : offset + limit]

    async def list_outputs(self) -> list[OutputFile]:
        return [OutputFile(name, len(data)) for name, data in self.outputs.items()]

    async def read_output(self, name: str) -> bytes:
        return self.outputs[name]

    async def save_log_marks(self, marks: Mapping[str, LogMark]) -> None:
        self.log_marks = dict(marks)
        self.saved_marks.append(dict(marks))

    def detach(self) -> None:
        self.detached = True


class FakeRuntime:
    """A runtime whose stages fail, stall or end as a test scripts them; records every call."""

    name = "fake"
    black_box = False

    def __init__(
        self,
        *,
        watch: Watch | None = None,
        preload_failures: Iterable[StageFailure] = (),
        preload_fails_forever: StageFailure | None = None,
        preload_gate: asyncio.Event | None = None,
        preload_swallows_cancel: bool = False,
        start_failure: StageFailure | None = None,
        exit_with: KernelExit | None = None,
        logs: Mapping[str, bytes] | None = None,
        outputs: Mapping[str, bytes] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self.watch = watch or Watch()
        self.preload_failures = deque(preload_failures)  # raised by the first preloads, in order
        self.preload_fails_forever = preload_fails_forever
        self.preload_gate = preload_gate  # each preload waits for it
        # A cancelled preload returns normally (as one finishing its work regardless would).
        self.preload_swallows_cancel = preload_swallows_cancel
        self.start_failure = start_failure
        self.exit_with = exit_with  # None: kernels run until exit() or terminate()
        self.logs = dict(logs if logs is not None else {"stdout": b"hello\n", "stderr": b"warn\n"})
        self.outputs = dict(outputs or {})
        self.info = dict(info or {"host": "fake-host", "pid": 4242})
        self.preload_calls: list[KernelId] = []
        self.preloads_cancelled = 0
        self.start_calls: list[KernelId] = []
        self.stage_calls: list[KernelId] = []
        self.unstage_calls: list[KernelId] = []
        self.opened = self.closed = 0  # open() and close() calls
        self.launches: list[KernelLaunch] = []  # every start's launch, in order
        self.kernels: dict[KernelId, FakeKernel] = {}
        self.adoption: FakeAdoption | None = None  # set one to play a runtime that adopts

    @property
    def stages(self) -> bool:
        return True

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        self.closed += 1

    async def stage(self, launch: KernelLaunch) -> None:
        self.stage_calls.append(launch.kernel_id)

    async def unstage(self, launch: KernelLaunch) -> None:
        self.unstage_calls.append(launch.kernel_id)

    async def preload(self, launch: KernelLaunch) -> None:
        self.preload_calls.append(launch.kernel_id)
        self.watch.changed()
        if self.preload_gate is not None:
            try:
                await self.preload_gate.wait()
            except asyncio.CancelledError:
                self.preloads_cancelled += 1
                self.watch.changed()
                if not self.preload_swallows_cancel:
                    raise
        if self.preload_failures:
            raise self.preload_failures.popleft()
        if self.preload_fails_forever is not None:
            raise self.preload_fails_forever

    async def start(self, launch: KernelLaunch) -> FakeKernel:
        self.start_calls.append(launch.kernel_id)
        self.launches.append(launch)
        if self.start_failure is not None:
            raise self.start_failure
        kernel = FakeKernel(self.watch, self.info, self.logs, self.outputs, self.exit_with)
        self.kernels[launch.kernel_id] = kernel
        self.watch.changed()
        return kernel

    def terminate_calls(self) -> dict[KernelId, list[float]]:
        """Per started kernel, the grace periods terminate was called with."""
        return {kid: k.terminate_calls for kid, k in self.kernels.items()}


class FakeLeft:
    """A kernel an earlier agent left, as a runtime finds it."""

    def __init__(self, kernel_id: KernelId, devices: tuple[int, ...] = ()) -> None:
        self.kernel_id = kernel_id
        self.devices = devices


class FakeAdoption:
    """A runtime's adoption: finds `left`, adopts each as a running FakeKernel, records discards."""

    def __init__(self, runtime: FakeRuntime, left: Iterable[FakeLeft]) -> None:
        self.runtime = runtime
        self.left = list(left)
        self.searched: list[Path] = []
        self.adopted: dict[KernelId, FakeKernel] = {}
        self.discarded: list[KernelId] = []

    async def find_left(self, kernels_dir: Path) -> list[FakeLeft]:
        self.searched.append(kernels_dir)
        return list(self.left)

    async def adopt(self, left: FakeLeft, launch: KernelLaunch) -> FakeKernel:
        runtime = self.runtime
        kernel = FakeKernel(runtime.watch, runtime.info, runtime.logs, runtime.outputs, None)
        self.adopted[left.kernel_id] = runtime.kernels[left.kernel_id] = kernel
        runtime.watch.changed()
        return kernel

    async def discard(self, left: FakeLeft) -> None:
        self.discarded.append(left.kernel_id)
        self.runtime.watch.changed()


class FakeManagerClient:
    """The manager, in memory: scripted answers and failures, every call recorded."""

    def __init__(
        self,
        *,
        watch: Watch | None = None,
        accepted_tokens: Iterable[str] | None = None,
        new_token: str | None = "agent-own-token",
        heartbeat_interval_s: float = 15.0,
        assignment_wait_s: float = 30.0,
    ) -> None:
        self.watch = watch or Watch()
        self.accepted_tokens = None if accepted_tokens is None else set(accepted_tokens)
        self.new_token = new_token  # what a register answers with (None: "keep yours")
        self.heartbeat_interval_s = heartbeat_interval_s
        self.assignment_wait_s = assignment_wait_s
        # Scripted answers: heartbeat statuses and assignments (an exception item is raised).
        self.heartbeats: asyncio.Queue[str | BaseException] = asyncio.Queue()
        self.assignments: asyncio.Queue[AssignmentMessage | BaseException] = asyncio.Queue()
        # Raised by the next calls of a method, one each, before anything else happens.
        self.errors: dict[str, deque[BaseException]] = {}
        self.down: BaseException | None = None  # when set, every call raises it
        self.report_gate: asyncio.Event | None = None  # when set, report calls wait for it
        self.register_calls: list[str] = []  # the token of each call
        self.heartbeat_calls = 0
        self.assignment_calls: list[int | None] = []  # the `since` of each call
        self.report_calls: list[list[KernelReportMessage]] = []  # every attempt
        self.delivered: list[list[KernelReportMessage]] = []  # the batches that went through
        # Reports the manager refuses, once each: (kernel, status) → why.
        self.refusals: dict[tuple[uuid.UUID, KernelStatus], str] = {}
        self.log_chunks: list[LogChunkMessage] = []
        self.outputs: list[OutputMessage] = []
        self.closed = False

    def fail_next(self, method: str, *errors: BaseException) -> None:
        """Make the next calls of `method` raise `errors`, one each."""
        self.errors.setdefault(method, deque()).extend(errors)

    @property
    def reports(self) -> list[KernelReportMessage]:
        return [r for batch in self.delivered for r in batch]

    def reports_of(self, kid: uuid.UUID) -> list[KernelReportMessage]:
        return [r for r in self.reports if r.kernel_id == kid]

    def statuses_of(self, kid: uuid.UUID) -> list[KernelStatus]:
        return [r.status for r in self.reports_of(kid)]

    async def register(self, request: RegisterRequest, token: str) -> RegisterResponse:
        self.register_calls.append(token)
        self._check("register")
        if self.accepted_tokens is not None and token not in self.accepted_tokens:
            raise ManagerRejectedError(401, {"detail": "unknown token"})
        return RegisterResponse(
            agent_id=request.agent_id,
            token=self.new_token,
            heartbeat_interval_s=self.heartbeat_interval_s,
            heartbeat_timeout_s=self.heartbeat_interval_s * 3,
            assignment_wait_s=self.assignment_wait_s,
        )

    async def heartbeat(self, agent_id: str) -> HeartbeatResponse:
        self.heartbeat_calls += 1
        self._check("heartbeat")
        answer = await self.heartbeats.get()
        self.watch.changed()
        if isinstance(answer, BaseException):
            raise answer
        return HeartbeatResponse(status=answer)

    async def assignment(
        self, agent_id: str, since: int | None, wait_s: float
    ) -> AssignmentMessage:
        self.assignment_calls.append(since)
        self._check("assignment")
        answer = await self.assignments.get()
        self.watch.changed()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        self.report_calls.append(list(reports))
        self.watch.changed()
        if self.report_gate is not None:
            await self.report_gate.wait()
        self._check("report")
        self.delivered.append(list(reports))
        self.watch.changed()
        refused = {
            str(r.kernel_id): self.refusals.pop((r.kernel_id, r.status))
            for r in reports
            if (r.kernel_id, r.status) in self.refusals
        }
        return ReportAccepted(
            applied=sum(str(r.kernel_id) not in refused for r in reports), refused=refused
        )

    async def upload_logs(self, agent_id: str, chunks: list[LogChunkMessage]) -> None:
        self._check("upload_logs")
        self.log_chunks.extend(chunks)
        self.watch.changed()

    async def upload_outputs(self, agent_id: str, outputs: list[OutputMessage]) -> None:
        self._check("upload_outputs")
        self.outputs.extend(outputs)
        self.watch.changed()

    async def fetch_upload(self, agent_id: str, kernel_id: uuid.UUID) -> bytes:
        self._check("fetch_upload")
        raise ManagerRejectedError(404, {"detail": "no uploads in this fake"})

    async def close(self) -> None:
        self.closed = True

    def _check(self, method: str) -> None:
        self.watch.changed()
        pending = self.errors.get(method)
        if pending:
            raise pending.popleft()
        if self.down is not None:
            raise self.down


def unavailable(what: str = "connection refused") -> ManagerUnavailableError:
    """The error a client raises when the manager cannot be reached."""
    return ManagerUnavailableError(what)


def rejected(status: int, **problem: Any) -> ManagerRejectedError:
    """The error a client raises when the manager refuses a request."""
    return ManagerRejectedError(status, {"detail": "refused", **problem})
