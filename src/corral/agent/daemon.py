"""The agent daemon: registers, heartbeats, long-polls its assignment and reconciles.

Reconciling compares the manager's desired kernels with the workers this agent runs: a kernel
to prepare or run gets a worker (`kernel_worker.py`); a worker whose kernel left the assignment
(re-scheduled elsewhere, ended by the manager) is stopped without a report, since the kernel is
no longer this agent's; a kernel the manager believes running here that this agent does not know
is reported lost. Reports go out in order and in batches through one shipper, retried with
backoff while the manager is away. On SIGTERM the agent stops taking work and, by policy, stops
its kernels and reports them (`stop`, the default) or leaves them running (`leave`).

Kernels left running are adopted when the agent comes back with the same data directory and id,
before the manager's heartbeat timeout declares it lost. If its runtime can adopt
(`Runtime.adoption`), the agent looks for the kernels an earlier agent left before it registers;
the first assignment decides their fate. One the manager still believes started here gets a
worker that takes it over (its devices too): it runs on, or, if it ended meanwhile, its real exit
is reported; only a kernel with no trace is lost. One no longer assigned here is killed and its
traces removed: it is not this agent's any more (the manager gave up on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Literal

from corral._private_file import write_private
from corral.agent.client import ManagerClient, ManagerRejectedError, ManagerUnavailableError
from corral.agent.devices import DeviceAllocationError, DeviceAllocator
from corral.agent.kernel_worker import KernelWorker, WorkerSettings
from corral.agent.ports import free_port
from corral.agent.protocol import (
    AssignedKernelMessage,
    AssignmentMessage,
    KernelReportMessage,
    RegisterRequest,
    RegisterResponse,
)
from corral.agent.runtime import (
    KERNEL_LOST_CAUSE,
    KernelLaunch,
    LeftKernel,
    RunningKernel,
    Runtime,
)
from corral.agent.shipper import Backoff, ReportShipper
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.restarts import restart_position
from corral.domain.session import KernelIntent
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionType
from corral.domain.status import KERNEL_STARTED, KernelStatus
from corral.domain.types import Clock, KernelId, SessionId, utcnow

logger = logging.getLogger(__name__)

ShutdownPolicy = Literal["stop", "leave"]
AGENT_SHUTDOWN_CAUSE = FailureCause.AGENT_SHUTDOWN
DEVICE_CAUSE = FailureCause.DEVICE_UNAVAILABLE
_STARTABLE = frozenset(
    {KernelStatus.PREPARING, KernelStatus.PULLING, KernelStatus.PREPARED, KernelStatus.CREATING}
)
# A left kernel in one of these was started: CREATING when its RUNNING report never arrived.
_ADOPTABLE = KERNEL_STARTED | {KernelStatus.CREATING}
TOKEN_FILE = "agent-token"
KERNELS_DIR = "kernels"  # under the data directory: one work directory per kernel


@record
class AgentConfig:
    """Who the agent is and how it behaves."""

    agent_id: str
    token: str  # the join token (first time) or the agent's own token
    address: str  # how other nodes reach this one (kernels' MASTER_ADDR, cluster hosts)
    slots: ResourceSlots
    data_dir: Path
    resource_group: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    on_shutdown: ShutdownPolicy = "stop"
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    backoff_initial_s: float = 0.5
    # Capped low: after a manager's (or its database's) outage the agent's next report,
    # heartbeat or poll is at most this far away, so work resumes within seconds. A failed
    # attempt is one refused connection or one 503, cheap for a manager even from many agents.
    backoff_max_s: float = 5.0
    shutdown_flush_s: float = 10.0  # how long a stopping agent tries to deliver its reports


class AgentDaemon:
    """One agent: run() until stop(); kernels run as workers, one asyncio task each."""

    def __init__(
        self,
        config: AgentConfig,
        client: ManagerClient,
        runtime: Runtime,
        *,
        devices: DeviceAllocator | None = None,
        clock: Clock = utcnow,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.runtime = runtime
        self.devices = devices or DeviceAllocator(0)
        self.clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.shipper = ReportShipper(client, config.agent_id, self._backoff(), sleep)
        self.workers: dict[KernelId, KernelWorker] = {}
        self._tasks: dict[KernelId, asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        self.registered = asyncio.Event()
        self.registration: RegisterResponse | None = None
        self.revision: int | None = None
        # Kernels an earlier agent left, until the first assignment says whose they are.
        self._left: dict[KernelId, LeftKernel] = {}

    async def run(self) -> None:
        """Register, then heartbeat, poll and ship until stop(); then shut down by policy."""
        self._log_startup()
        shipping = asyncio.create_task(self.shipper.run(), name="agent-shipper")
        loops: set[asyncio.Task[None]] = set()
        try:
            await self.runtime.open()
            await self._find_left_kernels()
            if not await self._register_until_done():
                return
            loops = {
                asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeat"),
                asyncio.create_task(self._poll_loop(), name="agent-poll"),
            }
            stopping = asyncio.create_task(self._stop.wait())
            done, _ = await asyncio.wait(
                {*loops, shipping, stopping}, return_when=asyncio.FIRST_COMPLETED
            )
            stopping.cancel()
            for task in done - {stopping}:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._shut_down_kernels()
            await self.runtime.close()
            delivered = await self.shipper.flush(self.config.shutdown_flush_s)
            if not delivered:
                logger.warning("agent.shutdown_reports_undelivered")
            shipping.cancel()
            await asyncio.gather(shipping, return_exceptions=True)
            await self.client.close()
            logger.info("agent.stopped", extra={"agent_id": self.config.agent_id})

    async def stop(self) -> None:
        """Stop taking work and shut down (run() returns when done). Idempotent."""
        self._stop.set()

    async def kill_kernels_now(self) -> None:
        """While stopping, kill the kernels still in their grace period at once (a second
        Ctrl-C) rather than wait it out; none under `--on-shutdown leave`, whose kernels are
        meant to run on."""
        if self.config.on_shutdown == "leave":
            return
        await asyncio.gather(*(w.kill_now() for w in self.workers.values() if not w.done))

    # -- registration and liveness --------------------------------------------------------

    async def _register_until_done(self) -> bool:
        backoff = self._backoff()
        while not self._stop.is_set():
            try:
                await self._register()
            except ManagerUnavailableError as exc:
                if not backoff.failing:
                    logger.warning("agent.manager_unreachable", extra={"error": str(exc)})
                await self._sleep_or_stop(backoff.next_delay_s())
                continue
            return True
        return False

    async def _register(self) -> None:
        config = self.config
        request = RegisterRequest(
            agent_id=config.agent_id,
            address=config.address,
            resource_group=config.resource_group,
            slots=config.slots,
            labels=dict(config.labels),
            runtime=self.runtime.name,
        )
        tokens = list(dict.fromkeys(t for t in (self._saved_token(), config.token) if t))
        for index, token in enumerate(tokens):
            try:
                response = await self.client.register(request, token)
            except ManagerRejectedError as exc:
                if exc.status == 401 and index + 1 < len(tokens):
                    continue  # a stale saved token: try the one we were given
                raise
            break
        if response.token is not None:
            self._save_token(response.token)
        self.registration = response
        self.registered.set()
        logger.info(
            "agent.registered",
            extra={"agent_id": config.agent_id, "new_token": response.token is not None},
        )

    async def _heartbeat_loop(self) -> None:
        backoff = self._backoff()
        while True:
            assert self.registration is not None
            await self._sleep(self.registration.heartbeat_interval_s)
            try:
                status = (await self.client.heartbeat(self.config.agent_id)).status
            except ManagerUnavailableError:
                await self._sleep(backoff.next_delay_s())
                continue
            backoff.reset()
            if status != "ALIVE":
                logger.warning("agent.declared_lost", extra={"status": status})
                with contextlib.suppress(ManagerUnavailableError):
                    await self._register()

    async def _poll_loop(self) -> None:
        backoff = self._backoff()
        while True:
            assert self.registration is not None
            try:
                assignment = await self.client.assignment(
                    self.config.agent_id, self.revision, self.registration.assignment_wait_s
                )
            except ManagerUnavailableError as exc:
                if not backoff.failing:
                    logger.warning("agent.manager_unreachable", extra={"error": str(exc)})
                await self._sleep(backoff.next_delay_s())
                continue
            except ManagerRejectedError as exc:
                if exc.status not in (401, 404):
                    raise
                self.revision = None
                try:
                    await self._register()  # forgotten by the manager: join again
                except ManagerUnavailableError:
                    await self._sleep(backoff.next_delay_s())
                continue
            if backoff.failing:
                logger.info("agent.manager_reachable")
            backoff.reset()
            self.revision = assignment.revision
            if self._left:  # the first assignment: before anything new is started
                await self._settle_left_kernels(assignment)
            self.reconcile(assignment)

    # -- reconciling ------------------------------------------------------------------------

    def reconcile(self, assignment: AssignmentMessage) -> None:
        """Bring the running workers in line with the manager's desired state."""
        assigned = {k.id: k for k in assignment.kernels}
        for kernel_id in [k for k in self.workers if k not in assigned]:
            self._forget(kernel_id)
        for kernel in assignment.kernels:
            # What the manager shows it has needs no sending again.
            self.shipper.acknowledge(
                kernel.id,
                kernel.attempt,
                kernel.status,
                restart_position(kernel.restarts, kernel.restarting),
            )
            worker = self.workers.get(KernelId(kernel.id))
            if worker is not None and worker.attempt != kernel.attempt:
                # Placed here again after going back to PENDING: a new placement, started
                # afresh; the earlier one's worker (and its kernel, if alive) is done with.
                self._forget(KernelId(kernel.id))
                worker = None
            if worker is not None:
                if worker.done:
                    self._resend_end(worker, asked=kernel.asked)
                else:
                    worker.update(kernel)
                    if kernel.asked and not self.shipper.pending(worker.kernel_id):
                        # The manager heard nothing of it for a while: it still runs here.
                        self.shipper.report(worker.status_report(), answer=True)
            elif kernel.desired_state in (KernelIntent.PREPARE, KernelIntent.RUN) and (
                kernel.status in _STARTABLE
            ):
                self._spawn(kernel)
            elif kernel.status in KERNEL_STARTED:
                self._answer_once(
                    kernel,
                    KernelReportMessage(
                        kernel_id=kernel.id,
                        status=KernelStatus.ERROR,
                        failure_cause=KERNEL_LOST_CAUSE,
                        message=f"agent {self.config.agent_id} does not know this kernel "
                        "(it restarted) and found no trace of it to adopt",
                        attempt=kernel.attempt,
                    ),
                )
            elif kernel.desired_state is KernelIntent.STOP:
                self._answer_once(
                    kernel,
                    KernelReportMessage(
                        kernel_id=kernel.id,
                        status=KernelStatus.TERMINATED,
                        message="stopped before it started on this agent",
                        attempt=kernel.attempt,
                    ),
                )

    def _resend_end(self, worker: KernelWorker, *, asked: bool) -> None:
        """The manager still lists a kernel this agent finished: unless its end is on its way
        or was acknowledged (the assignment was read before it arrived), the end never arrived
        (it was refused), so it is sent again, and always when the manager asks about it; the
        kernel is never started again."""
        report = worker.last_report
        if report is None or self.shipper.pending(worker.kernel_id):
            return
        if asked or not self.shipper.acknowledged(report):
            logger.info("agent.kernel_end_resent", extra={"kernel_id": str(worker.kernel_id)})
            self.shipper.report(report, answer=asked)

    def _spawn(self, kernel: AssignedKernelMessage) -> None:
        kernel_id = KernelId(kernel.id)
        try:
            devices = self.devices.allocate(kernel_id, int(kernel.slots.get("cuda.device", 0)))
        except ValueError as exc:
            self._fail_on_devices(kernel, str(exc))
            return
        self._run_worker(kernel, self._launch(kernel, devices))

    def _fail_on_devices(self, kernel: AssignedKernelMessage, message: str) -> None:
        """Report the kernel failed for want of its devices; it is done here."""
        self._answer_once(
            kernel,
            KernelReportMessage(
                kernel_id=kernel.id,
                status=KernelStatus.ERROR,
                failure_cause=DEVICE_CAUSE,
                message=message,
                attempt=kernel.attempt,
            ),
        )

    def _run_worker(
        self,
        kernel: AssignedKernelMessage,
        launch: KernelLaunch,
        adopt: Callable[[], Awaitable[RunningKernel]] | None = None,
    ) -> None:
        kernel_id = KernelId(kernel.id)
        worker = KernelWorker(
            kernel,
            launch,
            self.runtime,
            self.shipper,
            settings=self.config.worker,
            clock=self.clock,
            sleep=self._sleep,
            adopt=adopt,
        )
        self.workers[kernel_id] = worker
        task = asyncio.create_task(worker.run(), name=f"kernel-{kernel_id}")
        self._tasks[kernel_id] = task
        task.add_done_callback(functools.partial(self._worker_ended, kernel_id))

    # -- kernels an earlier agent left ----------------------------------------------------

    async def _find_left_kernels(self) -> None:
        adoption = self.runtime.adoption
        if adoption is None:
            return
        found = await adoption.find_left(self.config.data_dir / KERNELS_DIR)
        self._left = {left.kernel_id: left for left in found}
        if found:
            logger.info("agent.left_kernels_found", extra={"kernels": len(found)})

    async def _settle_left_kernels(self, assignment: AssignmentMessage) -> None:
        """Adopt the left kernels the manager believes started here; discard all the others."""
        adoption = self.runtime.adoption
        assert adoption is not None  # kernels are only ever found through it
        for kernel in assignment.kernels:
            left = self._left.get(KernelId(kernel.id))
            if left is not None and kernel.status in _ADOPTABLE and self._adopt(kernel, left):
                del self._left[left.kernel_id]
        left_over, self._left = list(self._left.values()), {}
        for left in left_over:
            try:
                await adoption.discard(left)
            except OSError as exc:
                extra = {"kernel_id": str(left.kernel_id), "error": str(exc)}
                logger.error("agent.left_kernel_not_discarded", extra=extra)

    def _adopt(self, kernel: AssignedKernelMessage, left: LeftKernel) -> bool:
        """Give a worker the left kernel; False if its devices cannot be accounted for."""
        adoption = self.runtime.adoption
        assert adoption is not None
        kernel_id = KernelId(kernel.id)
        try:
            # Before anything new is started: the kernel holds its devices already.
            self.devices.adopt(kernel_id, left.devices)
        except DeviceAllocationError as exc:
            self._fail_on_devices(kernel, f"cannot adopt the kernel: {exc}")
            return False
        launch = self._launch(kernel, left.devices)
        logger.info("agent.kernel_adopted", extra={"kernel_id": str(kernel_id)})
        self._run_worker(kernel, launch, functools.partial(adoption.adopt, left, launch))
        return True

    def _worker_ended(self, kernel_id: KernelId, task: asyncio.Task[None]) -> None:
        if self._tasks.get(kernel_id) in (None, task):  # not a newer placement's devices
            self.devices.release(kernel_id)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "agent.worker_crashed",
                extra={"kernel_id": str(kernel_id)},
                exc_info=task.exception(),
            )

    def _answer_once(self, kernel: AssignedKernelMessage, report: KernelReportMessage) -> None:
        """Report the kernel's end; a placeholder worker keeps it from being answered again
        (and from being started), and sends the same end again if it was not delivered."""
        self.shipper.report(report)
        worker = KernelWorker(
            kernel,
            self._launch(kernel, ()),
            self.runtime,
            self.shipper,
            settings=self.config.worker,
        )
        worker.progress.abort("answered", "")
        worker.progress.abandon()
        worker.last_report = report
        self.workers[KernelId(kernel.id)] = worker

    def _forget(self, kernel_id: KernelId) -> None:
        self.workers.pop(kernel_id, None)
        self.shipper.forget(kernel_id)
        task = self._tasks.pop(kernel_id, None)
        if task is not None and not task.done():
            task.cancel()  # the worker kills its kernel quietly: it is no longer ours

    def _launch(self, kernel: AssignedKernelMessage, devices: tuple[int, ...]) -> KernelLaunch:
        spec = kernel.spec
        return KernelLaunch(
            kernel_id=KernelId(kernel.id),
            session_id=SessionId(kernel.session_id),
            session_type=str(spec.get("type", "BATCH")),
            image=str(spec.get("image", "")),
            command=tuple(spec.get("command") or ()),
            env=dict(spec.get("env") or {}),
            cluster_size=kernel.cluster_size,
            cluster_rank=kernel.cluster_index,
            cluster_role=kernel.cluster_role,
            cluster_hosts=tuple(
                h.rsplit(":", 1)[0] if h.count(":") == 1 else h for h in kernel.cluster_hosts
            ),
            slots=kernel.slots,
            work_dir=self.config.data_dir / KERNELS_DIR / str(kernel.id),
            devices=devices,
            array_number=kernel.array_number,
            array_index=kernel.array_index,
            workdir=Path(spec["workdir"]) if spec.get("workdir") else None,
            upload=spec.get("upload") or None,
            attempt=kernel.attempt,
            owner=kernel.owner,
            port=free_port() if spec.get("type") == SessionType.INFERENCE.value else None,
        )

    # -- shutdown ---------------------------------------------------------------------------

    async def _shut_down_kernels(self) -> None:
        live = {kid: w for kid, w in self.workers.items() if not w.done}
        if not live:
            return
        logger.info(
            "agent.shutting_down",
            extra={"policy": self.config.on_shutdown, "kernels": len(live)},
        )
        tasks = [self._tasks[kid] for kid in live if kid in self._tasks]
        if self.config.on_shutdown == "leave":
            for worker in live.values():
                worker.detach()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(w.shutdown(AGENT_SHUTDOWN_CAUSE) for w in live.values()))

    # -- helpers ----------------------------------------------------------------------------

    def _backoff(self) -> Backoff:
        return Backoff(self.config.backoff_initial_s, self.config.backoff_max_s, self._rng)

    async def _sleep_or_stop(self, delay_s: float) -> None:
        sleeping = asyncio.ensure_future(self._sleep(delay_s))
        stopping = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({sleeping, stopping}, return_when=asyncio.FIRST_COMPLETED)
        sleeping.cancel()
        stopping.cancel()

    def _token_path(self) -> Path:
        return self.config.data_dir / TOKEN_FILE

    def _saved_token(self) -> str | None:
        try:
            data = json.loads(self._token_path().read_text())
        except (OSError, ValueError):
            return None
        if data.get("agent_id") != self.config.agent_id:
            return None
        token = data.get("token")
        return token if isinstance(token, str) else None

    def _save_token(self, token: str) -> None:
        path = self._token_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, json.dumps({"agent_id": self.config.agent_id, "token": token}))

    def _log_startup(self) -> None:
        notes = getattr(self.runtime, "notes", None)
        lines = notes().lines if callable(notes) else ()
        logger.info(
            "agent.starting",
            extra={
                "agent_id": self.config.agent_id,
                "runtime": self.runtime.name,
                "slots": self.config.slots.format_human(),
            },
        )
        for line in lines:
            logger.info("agent.runtime_note", extra={"note": line})
