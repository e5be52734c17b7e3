"""AgentDaemon (register, heartbeat, poll, reconcile, shut down), ReportShipper and Backoff."""

from __future__ import annotations

import asyncio
import json
import math
import random
import stat
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.agent.client import ManagerRejectedError
from corral.agent.daemon import (
    AGENT_SHUTDOWN_CAUSE,
    DEVICE_CAUSE,
    KERNEL_LOST_CAUSE,
    KERNELS_DIR,
    TOKEN_FILE,
    AgentConfig,
    AgentDaemon,
    ShutdownPolicy,
)
from corral.agent.devices import DeviceAllocator
from corral.agent.kernel_worker import WorkerSettings
from corral.agent.protocol import MAX_BATCH, KernelReportMessage
from corral.agent.runtime import KernelExit
from corral.agent.shipper import Backoff, ReportShipper
from corral.domain.session import KernelIntent
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus

from ._fakes import (
    FakeAdoption,
    FakeLeft,
    FakeManagerClient,
    FakeRuntime,
    FakeSleep,
    Watch,
    assigned,
    assignment,
    kernel_id,
    rejected,
    unavailable,
)

K = KernelStatus
AGENT_ID = "agent-1"
JOIN_TOKEN = "join-token"
OWN_TOKEN = "agent-own-token"  # what the fake manager hands out on registration
HEARTBEAT_S = 15.0
LOG_INTERVAL_S = 3600.0  # the workers' log pump interval: parked
STOP_GRACE_S = 7.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
A, B, X = kernel_id(1), kernel_id(2), kernel_id(9)


class UpperBound(random.Random):
    """An rng whose uniform(a, b) is always b: full jitter at its largest, so delays are exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


@dataclass
class Rig:
    """A daemon over in-memory fakes that share one Watch."""

    tmp_path: Path
    policy: ShutdownPolicy = "stop"
    devices: int = 0
    watch: Watch = field(default_factory=Watch)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = FakeManagerClient(watch=self.watch, heartbeat_interval_s=HEARTBEAT_S)
        self.runtime = FakeRuntime(watch=self.watch)
        self.sleep = FakeSleep(park=(LOG_INTERVAL_S,), watch=self.watch)
        config = AgentConfig(
            agent_id=AGENT_ID,
            token=JOIN_TOKEN,
            address="10.0.0.1",
            slots=ResourceSlots({"cpu": 4}),
            data_dir=self.tmp_path,
            on_shutdown=self.policy,
            worker=WorkerSettings(stop_grace_s=STOP_GRACE_S, log_interval_s=LOG_INTERVAL_S),
            backoff_initial_s=BACKOFF_INITIAL_S,
            backoff_max_s=BACKOFF_MAX_S,
            shutdown_flush_s=2.0,
        )
        self.daemon = AgentDaemon(
            config,
            self.client,
            self.runtime,
            devices=DeviceAllocator(self.devices),
            sleep=self.sleep,
            rng=UpperBound(),
        )

    def ship(self) -> None:
        """Run the daemon's shipper (reconcile tests drive the daemon without run())."""
        self.tasks.append(asyncio.create_task(self.daemon.shipper.run()))

    async def delivered(self, kid: uuid.UUID, status: KernelStatus) -> None:
        """Until the manager has received `status` for kernel `kid`."""
        await self.watch.until(lambda: status in self.client.statuses_of(kid))

    async def flushed(self) -> None:
        assert await self.daemon.shipper.flush(2.0)

    @property
    def token_path(self) -> Path:
        return self.tmp_path / TOKEN_FILE


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Callable[..., Rig]]:
    """Build rigs; at the end, every worker and side task they started is cancelled."""
    rigs: list[Rig] = []

    def build(*, policy: ShutdownPolicy = "stop", devices: int = 0) -> Rig:
        rig = Rig(tmp_path, policy, devices)
        rigs.append(rig)
        return rig

    yield build
    pending = [t for r in rigs for t in r.tasks]
    pending += [t for t in asyncio.all_tasks() if t.get_name().startswith("kernel-")]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


@asynccontextmanager
async def running(rig: Rig) -> AsyncIterator[asyncio.Task[None]]:
    """Run the daemon until it registered; on exit stop it and surface any crash of run()."""
    task = asyncio.create_task(rig.daemon.run())
    registered = asyncio.create_task(rig.daemon.registered.wait())
    await asyncio.wait({task, registered}, timeout=2, return_when=asyncio.FIRST_COMPLETED)
    registered.cancel()
    assert rig.daemon.registered.is_set(), "the daemon did not register"
    try:
        yield task
    finally:
        await rig.daemon.stop()
        async with asyncio.timeout(2):
            await task


async def first_of(task: asyncio.Task[None], condition: Awaitable[object]) -> None:
    """Until `condition` completes or `task` ends, whichever comes first."""
    waiting = asyncio.ensure_future(condition)
    await asyncio.wait({task, waiting}, timeout=2, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


def report(kid: uuid.UUID, status: KernelStatus = K.RUNNING) -> KernelReportMessage:
    return KernelReportMessage(kernel_id=kid, status=status)


# -- reconciling ------------------------------------------------------------------------------


async def test_reconcile_spawns_one_worker_per_kernel_and_feeds_it_later_assignments(
    make_rig: Callable[..., Rig],
) -> None:
    """Each kernel to PREPARE gets one worker; a later assignment (RUN) goes to that worker."""
    rig = make_rig()
    rig.ship()
    rig.daemon.reconcile(assignment(1, assigned(A), assigned(B)))
    assert set(rig.daemon.workers) == {A, B}
    await rig.delivered(A, K.PREPARED)
    await rig.delivered(B, K.PREPARED)
    worker_a = rig.daemon.workers[A]

    rig.daemon.reconcile(
        assignment(2, assigned(A, status=K.CREATING, desired=KernelIntent.RUN), assigned(B))
    )
    await rig.delivered(A, K.RUNNING)

    assert rig.daemon.workers[A] is worker_a
    assert sorted(rig.runtime.preload_calls) == [A, B]  # no second worker, no second preload
    assert rig.runtime.start_calls == [A]
    assert rig.client.statuses_of(A) == [K.PULLING, K.PREPARED, K.RUNNING]
    assert rig.client.statuses_of(B) == [K.PULLING, K.PREPARED]


async def test_reconcile_cancels_without_report_the_worker_of_a_kernel_that_left(
    make_rig: Callable[..., Rig],
) -> None:
    """A kernel gone from the assignment: its worker is cancelled, kernel killed, no report."""
    rig = make_rig(devices=1)
    rig.ship()
    gpu = {"cuda.device": 1000}
    rig.daemon.reconcile(
        assignment(
            1,
            assigned(A, status=K.CREATING, desired=KernelIntent.RUN),
            assigned(B, status=K.CREATING, desired=KernelIntent.RUN, slots=gpu),
        )
    )
    await rig.delivered(A, K.RUNNING)
    await rig.delivered(B, K.RUNNING)
    assert rig.daemon.devices.held(B) == (0,)
    [task_b] = [t for t in asyncio.all_tasks() if t.get_name() == f"kernel-{B}"]

    rig.daemon.reconcile(assignment(2, assigned(A, status=K.RUNNING, desired=KernelIntent.RUN)))
    await asyncio.gather(task_b, return_exceptions=True)
    await rig.flushed()

    assert task_b.cancelled()
    assert set(rig.daemon.workers) == {A}
    assert rig.runtime.kernels[B].terminate_calls == [STOP_GRACE_S]
    # Assigned at CREATING, it skipped PULLING and PREPARED; and nothing came after RUNNING.
    assert rig.client.statuses_of(B) == [K.RUNNING]
    assert rig.daemon.devices.held(B) == ()
    assert rig.runtime.kernels[A].terminate_calls == []


async def test_unknown_running_kernel_is_reported_lost_exactly_once(
    make_rig: Callable[..., Rig],
) -> None:
    """A RUNNING kernel this agent never knew: one ERROR kernel_lost, however often assigned."""
    rig = make_rig()
    rig.ship()
    lost = assigned(X, status=K.RUNNING, desired=KernelIntent.RUN)
    for revision in (1, 2, 3):
        rig.daemon.reconcile(assignment(revision, lost))
        await rig.flushed()

    [error] = rig.client.reports_of(X)
    assert (error.status, error.failure_cause) == (K.ERROR, KERNEL_LOST_CAUSE)
    assert rig.runtime.preload_calls == rig.runtime.start_calls == []


async def test_unknown_kernel_to_stop_is_reported_terminated_once(
    make_rig: Callable[..., Rig],
) -> None:
    """A not-yet-started kernel this agent never knew, desired STOP: one TERMINATED report."""
    rig = make_rig()
    rig.ship()
    stopped = assigned(X, status=K.PREPARED, desired=KernelIntent.STOP)
    for revision in (1, 2):
        rig.daemon.reconcile(assignment(revision, stopped))
        await rig.flushed()

    assert rig.client.statuses_of(X) == [K.TERMINATED]
    assert rig.runtime.preload_calls == []


async def test_a_finished_kernel_still_listed_gets_its_end_again_and_never_starts_again(
    make_rig: Callable[..., Rig],
) -> None:
    """The end of a kernel refused once, the manager still lists it CREATING: the agent sends
    the end again (once per assignment) and never starts the kernel again."""
    rig = make_rig()
    rig.runtime.exit_with = KernelExit(0, None, "done")
    rig.ship()
    rig.client.refusals[(A, K.TERMINATED)] = "refused once"
    run = assigned(A, status=K.CREATING, desired=KernelIntent.RUN)
    rig.daemon.reconcile(assignment(1, run))
    await rig.delivered(A, K.TERMINATED)
    await rig.flushed()
    assert rig.daemon.workers[A].done
    refused_end = rig.client.reports_of(A)[-1]

    rig.daemon.reconcile(assignment(2, run))  # the manager never got the end
    await rig.flushed()
    rig.daemon.reconcile(assignment(3, run))  # read before the resent end arrived
    await rig.flushed()

    assert rig.client.report_calls[-1] == [refused_end]
    assert rig.client.statuses_of(A).count(K.TERMINATED) == 2
    assert rig.runtime.start_calls == [A]


async def test_a_finished_kernel_placed_here_again_runs_as_a_new_attempt(
    make_rig: Callable[..., Rig],
) -> None:
    """A kernel that ended here, placed here again (next attempt) before the agent saw it
    leave: a fresh worker prepares and starts it, and its reports name the new attempt."""
    rig = make_rig()
    rig.runtime.exit_with = KernelExit(0, None, "done")
    rig.ship()
    rig.daemon.reconcile(assignment(1, assigned(A, status=K.CREATING, desired=KernelIntent.RUN)))
    await rig.delivered(A, K.TERMINATED)

    rig.daemon.reconcile(assignment(3, assigned(A, status=K.PREPARING, attempt=2)))
    await rig.watch.until(
        lambda: any(r.attempt == 2 and r.status is K.PREPARED for r in rig.client.reports)
    )

    assert rig.runtime.preload_calls == [A, A]
    assert rig.runtime.start_calls == [A]  # the new attempt waits for RUN
    assert [r.attempt for r in rig.client.reports_of(A)] == [1, 1, 1, 2, 2]


async def test_asked_about_a_kernel_the_agent_answers_with_what_it_knows(
    make_rig: Callable[..., Rig],
) -> None:
    """Asked about a running kernel: its status, sent although the manager had it; asked
    about a finished one: its end again; nothing is started again."""
    rig = make_rig()
    rig.ship()
    started = dict(status=K.CREATING, desired=KernelIntent.RUN)
    rig.daemon.reconcile(assignment(1, assigned(A, **started), assigned(B, **started)))
    await rig.delivered(A, K.RUNNING)
    await rig.delivered(B, K.RUNNING)
    rig.runtime.kernels[B].exit(KernelExit(0, None, "done"))
    await rig.delivered(B, K.TERMINATED)
    await rig.flushed()
    calls = len(rig.client.report_calls)

    asked = dict(status=K.RUNNING, desired=KernelIntent.RUN, asked=True)
    rig.daemon.reconcile(assignment(2, assigned(A, **asked), assigned(B, **asked)))
    await rig.flushed()

    (answers,) = rig.client.report_calls[calls:]
    assert [(r.kernel_id, r.status) for r in answers] == [(A, K.RUNNING), (B, K.TERMINATED)]
    assert rig.runtime.start_calls == [A, B]


# -- registration and liveness ----------------------------------------------------------------


async def test_stale_saved_token_falls_back_to_the_join_token_and_saves_the_new_one(
    make_rig: Callable[..., Rig],
) -> None:
    """A saved token refused with 401 → the join token; the new token is saved with mode 0600."""
    rig = make_rig()
    rig.token_path.write_text(json.dumps({"agent_id": AGENT_ID, "token": "stale"}))
    rig.client.accepted_tokens = {JOIN_TOKEN}
    async with running(rig):
        pass

    assert rig.client.register_calls == ["stale", JOIN_TOKEN]
    assert json.loads(rig.token_path.read_text()) == {"agent_id": AGENT_ID, "token": OWN_TOKEN}
    assert stat.S_IMODE(rig.token_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in rig.tmp_path.iterdir()) == [TOKEN_FILE]  # no temp file left


async def test_a_saved_token_that_works_is_used_and_kept(make_rig: Callable[..., Rig]) -> None:
    """The saved token is presented first; accepted (no new token), the file stays as it was."""
    rig = make_rig()
    saved = json.dumps({"agent_id": AGENT_ID, "token": "mine"})
    rig.token_path.write_text(saved)
    rig.client.new_token = None
    async with running(rig):
        pass

    assert rig.client.register_calls == ["mine"]
    assert rig.token_path.read_text() == saved


async def test_refused_token_equal_to_the_saved_one_raises_the_refusal(
    make_rig: Callable[..., Rig],
) -> None:
    """Saved token == given token, refused with 401: run() fails with that ManagerRejectedError."""
    rig = make_rig()
    rig.token_path.write_text(json.dumps({"agent_id": AGENT_ID, "token": JOIN_TOKEN}))
    rig.client.accepted_tokens = set()
    with pytest.raises(ManagerRejectedError) as refused:
        async with asyncio.timeout(2):
            await rig.daemon.run()
    assert refused.value.status == 401


async def test_heartbeat_answered_lost_registers_again(make_rig: Callable[..., Rig]) -> None:
    """A heartbeat answer LOST makes the agent register again (with its own, saved token)."""
    rig = make_rig()
    async with running(rig):
        rig.client.heartbeats.put_nowait("ALIVE")
        await rig.watch.until(lambda: rig.client.heartbeat_calls == 2)
        assert len(rig.client.register_calls) == 1
        rig.client.heartbeats.put_nowait("LOST")
        await rig.watch.until(lambda: len(rig.client.register_calls) == 2)

    assert rig.client.register_calls == [JOIN_TOKEN, OWN_TOKEN]


async def test_poll_loop_backs_off_while_unavailable_and_registers_again_on_404(
    make_rig: Callable[..., Rig],
) -> None:
    """Poll errors: unavailable → backoff sleeps and retry; 404 → register, poll from scratch."""
    rig = make_rig()
    for answer in (unavailable(), unavailable(), rejected(404), assignment(5, assigned(A))):
        rig.client.assignments.put_nowait(answer)
    async with running(rig):
        await rig.watch.until(lambda: len(rig.client.assignment_calls) == 5)
        assert rig.daemon.revision == 5
        assert set(rig.daemon.workers) == {A}

    assert rig.client.assignment_calls == [None, None, None, None, 5]
    assert len(rig.client.register_calls) == 2
    backoffs = [d for d in rig.sleep.delays if d not in (HEARTBEAT_S, LOG_INTERVAL_S)]
    assert backoffs == [BACKOFF_INITIAL_S, 2 * BACKOFF_INITIAL_S]


async def test_poll_loop_survives_the_manager_going_away_while_registering_again(
    make_rig: Callable[..., Rig],
) -> None:
    """404 on poll, then the re-registration finds the manager unreachable: the agent carries on."""
    rig = make_rig()
    task = asyncio.create_task(rig.daemon.run())
    try:
        await first_of(task, rig.daemon.registered.wait())
        rig.client.fail_next("register", unavailable())
        rig.client.assignments.put_nowait(rejected(404))
        rig.client.assignments.put_nowait(assignment(5))
        await first_of(task, rig.watch.until(lambda: rig.daemon.revision == 5))

        assert not task.done()
        assert rig.daemon.revision == 5
    finally:
        await rig.daemon.stop()
        await asyncio.gather(task, return_exceptions=True)


# -- shutdown ---------------------------------------------------------------------------------


async def test_stop_policy_ends_live_kernels_with_agent_shutdown_and_flushes(
    make_rig: Callable[..., Rig],
) -> None:
    """stop() with policy "stop": running and prepared kernels end ERROR agent_shutdown, sent."""
    rig = make_rig(policy="stop")
    async with running(rig) as task:
        rig.client.assignments.put_nowait(
            assignment(1, assigned(A, status=K.CREATING, desired=KernelIntent.RUN), assigned(B))
        )
        await rig.delivered(A, K.RUNNING)
        await rig.delivered(B, K.PREPARED)
        assert (rig.runtime.opened, rig.runtime.closed) == (1, 0)  # opened before any kernel
        await rig.daemon.stop()
        await rig.daemon.stop()  # idempotent
        async with asyncio.timeout(2):
            await task

    for kid, before in ((A, [K.RUNNING]), (B, [K.PULLING, K.PREPARED])):
        assert rig.client.statuses_of(kid) == [*before, K.ERROR]
        assert rig.client.reports_of(kid)[-1].failure_cause == AGENT_SHUTDOWN_CAUSE
    assert rig.runtime.kernels[A].ended
    assert rig.runtime.closed == 1  # once its kernels ended
    assert rig.client.closed


async def test_leave_policy_leaves_kernels_running_unreported(
    make_rig: Callable[..., Rig],
) -> None:
    """stop() with policy "leave": no terminate, no report after RUNNING."""
    rig = make_rig(policy="leave")
    async with running(rig):
        rig.client.assignments.put_nowait(
            assignment(1, assigned(A, status=K.CREATING, desired=KernelIntent.RUN))
        )
        await rig.delivered(A, K.RUNNING)

    assert rig.runtime.kernels[A].terminate_calls == []
    assert not rig.runtime.kernels[A].ended
    assert rig.runtime.kernels[A].detached  # let go of, for a later agent to adopt
    assert rig.client.statuses_of(A) == [K.RUNNING]
    assert rig.runtime.closed == 1  # what the runtime holds for no kernel is given back
    assert rig.client.closed


# -- kernels an earlier agent left ------------------------------------------------------------

RUN = KernelIntent.RUN
GPU = {"cuda.device": 1000}


async def test_a_left_kernel_still_assigned_is_adopted_before_new_kernels_take_devices(
    make_rig: Callable[..., Rig],
) -> None:
    """Adopted with its device (not lost, not started again); a new kernel gets another device."""
    rig = make_rig(devices=2)
    adoption = rig.runtime.adoption = FakeAdoption(rig.runtime, [FakeLeft(A, (0,))])
    async with running(rig):
        rig.client.assignments.put_nowait(
            assignment(
                1,
                assigned(B, status=K.CREATING, desired=RUN, slots=GPU),  # listed first
                assigned(A, status=K.RUNNING, desired=RUN, slots=GPU),
            )
        )
        await rig.watch.until(lambda: A in adoption.adopted)
        await rig.delivered(B, K.RUNNING)
        assert (rig.daemon.devices.held(A), rig.daemon.devices.held(B)) == ((0,), (1,))
        adoption.adopted[A].exit(KernelExit(3))
        await rig.delivered(A, K.ERROR)

    assert adoption.searched == [rig.tmp_path / KERNELS_DIR]
    assert rig.runtime.start_calls == [B]
    assert rig.client.statuses_of(A) == [K.TERMINATING, K.ERROR]
    error = rig.client.reports_of(A)[-1]
    assert (error.failure_cause, error.exit_code) == ("kernel_nonzero_exit", 3)
    assert adoption.discarded == []


async def test_a_left_kernel_whose_running_report_never_arrived_reports_it(
    make_rig: Callable[..., Rig],
) -> None:
    """Left at CREATING (its RUNNING report was lost): adopted, RUNNING reported with its info."""
    rig = make_rig()
    adoption = rig.runtime.adoption = FakeAdoption(rig.runtime, [FakeLeft(A)])
    async with running(rig):
        rig.client.assignments.put_nowait(
            assignment(1, assigned(A, status=K.CREATING, desired=RUN))
        )
        await rig.delivered(A, K.RUNNING)

    assert A in adoption.adopted
    assert rig.runtime.preload_calls == rig.runtime.start_calls == []
    assert rig.client.reports_of(A)[0].runtime_info == rig.runtime.info


async def test_left_kernels_the_first_assignment_does_not_hold_are_discarded_once(
    make_rig: Callable[..., Rig],
) -> None:
    """A left kernel not assigned here any more is discarded, after the first assignment only."""
    rig = make_rig()
    left = [FakeLeft(A), FakeLeft(X)]
    adoption = rig.runtime.adoption = FakeAdoption(rig.runtime, left)
    async with running(rig):
        rig.client.assignments.put_nowait(assignment(1, assigned(A, status=K.RUNNING, desired=RUN)))
        await rig.watch.until(lambda: adoption.discarded == [X])
        rig.client.assignments.put_nowait(assignment(2))
        await rig.watch.until(lambda: rig.client.assignment_calls[-1] == 2)

    assert list(adoption.adopted) == [A]
    assert adoption.discarded == [X]
    assert rig.client.reports_of(X) == []


async def test_a_left_kernel_the_manager_does_not_think_started_is_not_adopted(
    make_rig: Callable[..., Rig],
) -> None:
    """A left kernel the manager sees at PREPARING is not adopted: discarded, prepared anew."""
    rig = make_rig()
    adoption = rig.runtime.adoption = FakeAdoption(rig.runtime, [FakeLeft(A)])
    async with running(rig):
        rig.client.assignments.put_nowait(assignment(1, assigned(A)))
        await rig.delivered(A, K.PREPARED)
        await rig.watch.until(lambda: adoption.discarded == [A])

    assert adoption.adopted == {}
    assert rig.runtime.preload_calls == [A]


async def test_a_left_kernel_holding_devices_this_host_lacks_fails_and_is_discarded(
    make_rig: Callable[..., Rig],
) -> None:
    """Devices that cannot be accounted for: ERROR device_unavailable; the kernel is discarded."""
    rig = make_rig(devices=1)
    adoption = rig.runtime.adoption = FakeAdoption(rig.runtime, [FakeLeft(A, (3,))])
    async with running(rig):
        rig.client.assignments.put_nowait(
            assignment(1, assigned(A, status=K.RUNNING, desired=RUN, slots=GPU))
        )
        await rig.watch.until(lambda: adoption.discarded == [A])
        await rig.delivered(A, K.ERROR)

    assert adoption.adopted == {}
    assert rig.client.reports_of(A)[-1].failure_cause == DEVICE_CAUSE
    assert rig.daemon.devices.held(A) == ()


# -- ReportShipper ----------------------------------------------------------------------------


@pytest.fixture
async def shipper_rig() -> AsyncIterator[tuple[ReportShipper, FakeManagerClient, FakeSleep]]:
    """A ReportShipper running over the fake client; exact backoff delays (upper bound)."""
    watch = Watch()
    client = FakeManagerClient(watch=watch)
    sleep = FakeSleep(watch=watch)
    backoff = Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, UpperBound())
    shipper = ReportShipper(client, AGENT_ID, backoff, sleep)
    task = asyncio.create_task(shipper.run())
    yield shipper, client, sleep
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_shipper_sends_in_order_batching_what_queued_meanwhile(
    shipper_rig: tuple[ReportShipper, FakeManagerClient, FakeSleep],
) -> None:
    """Reports go out in order; those queued while a batch is in flight form the next batch."""
    shipper, client, _ = shipper_rig
    client.report_gate = asyncio.Event()
    first, second, third = report(A, K.PULLING), report(A, K.PREPARED), report(B, K.PULLING)
    shipper.report(first)
    await client.watch.until(lambda: len(client.report_calls) == 1)
    shipper.report(second)
    shipper.report(third)
    client.report_gate.set()
    assert await shipper.flush(2.0)

    assert client.delivered == [[first], [second, third]]
    assert shipper.sent == 3


async def test_shipper_retries_with_backoff_while_the_manager_is_unavailable(
    shipper_rig: tuple[ReportShipper, FakeManagerClient, FakeSleep],
) -> None:
    """Unavailable: the same batch is resent after growing delays; success resets the backoff."""
    shipper, client, sleep = shipper_rig
    client.fail_next("report", unavailable(), unavailable())
    batch = [report(A, K.PULLING), report(A, K.PREPARED)]
    for item in batch:
        shipper.report(item)
    assert await shipper.flush(2.0)

    assert client.report_calls == [batch, batch, batch]
    assert client.delivered == [batch]
    assert sleep.delays == [BACKOFF_INITIAL_S, 2 * BACKOFF_INITIAL_S]

    client.fail_next("report", unavailable())
    shipper.report(report(A, K.RUNNING))
    assert await shipper.flush(2.0)
    assert sleep.delays[-1] == BACKOFF_INITIAL_S  # the backoff started over


async def test_shipper_drops_a_refused_report_alone_and_sends_the_rest_once(
    shipper_rig: tuple[ReportShipper, FakeManagerClient, FakeSleep],
) -> None:
    """The answer refuses kernel B: nothing is sent again, and A's acknowledged statuses are
    not sent again either (a later A report of a status already acknowledged is dropped)."""
    shipper, client, _ = shipper_rig
    client.refusals[(B, K.RUNNING)] = "cannot move from TERMINATED to RUNNING"
    a1, b1, a2 = report(A, K.PULLING), report(B, K.RUNNING), report(A, K.PREPARED)
    for item in (a1, b1, a2):
        shipper.report(item)
    assert await shipper.flush(2.0)
    shipper.report(report(A, K.PULLING))  # e.g. re-emitted after a restart: not newer
    b2 = report(B, K.TERMINATED)
    shipper.report(b2)
    assert await shipper.flush(2.0)

    assert client.report_calls == [[a1, b1, a2], [b2]]


async def test_shipper_resends_after_a_lost_answer_only_what_the_manager_lacks(
    shipper_rig: tuple[ReportShipper, FakeManagerClient, FakeSleep],
) -> None:
    """A batch whose answer was lost is sent again without what an assignment since showed
    the manager has (PREPARED, now that it shows CREATING), with what queued meanwhile."""
    shipper, client, _ = shipper_rig
    client.fail_next("report", unavailable())
    client.report_gate = asyncio.Event()
    prepared = report(A, K.PREPARED)
    shipper.report(prepared)
    await client.watch.until(lambda: len(client.report_calls) == 1)
    shipper.acknowledge(A, None, K.CREATING)  # the assignment shows the kernel CREATING
    later = [report(A, K.RUNNING), report(A, K.TERMINATED)]
    for item in later:
        shipper.report(item)
    client.report_gate.set()
    assert await shipper.flush(2.0)

    assert client.report_calls == [[prepared], later]
    assert client.delivered == [later]


async def test_shipper_batches_never_exceed_the_protocol_limit(
    shipper_rig: tuple[ReportShipper, FakeManagerClient, FakeSleep],
) -> None:
    """More than MAX_BATCH queued reports go out in several batches of at most MAX_BATCH."""
    shipper, client, _ = shipper_rig
    for n in range(MAX_BATCH + 1):
        shipper.report(report(kernel_id(1000 + n)))
    assert await shipper.flush(2.0)

    assert sum(len(batch) for batch in client.delivered) == MAX_BATCH + 1
    assert max(len(batch) for batch in client.delivered) <= MAX_BATCH


# -- Backoff ----------------------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_stays_there_for_10000_failures() -> None:
    """Upper-bound delays double from the initial one, reach the cap, never exceed it."""
    backoff = Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, UpperBound())
    delays = [backoff.next_delay_s() for _ in range(10_000)]

    assert delays[:8] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert max(delays) == BACKOFF_MAX_S
    assert all(math.isfinite(d) for d in delays)


def test_backoff_reset_starts_the_delays_over() -> None:
    """reset() after failures: not failing, and the next delay is bounded by the initial one."""
    backoff = Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S, UpperBound())
    assert not backoff.failing
    for _ in range(10_000):
        backoff.next_delay_s()
    assert backoff.failing
    backoff.reset()

    assert not backoff.failing
    assert [backoff.next_delay_s() for _ in range(3)] == [0.5, 1.0, 2.0]


@given(
    initial_s=st.floats(min_value=1e-6, max_value=100.0),
    cap_factor=st.floats(min_value=1.0, max_value=1e6),
    failures=st.integers(min_value=0, max_value=200),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_delays_stay_within_full_jitter_bounds(
    initial_s: float, cap_factor: float, failures: int, seed: int
) -> None:
    """Every delay lies in [0, min(cap, initial·2ⁿ)], also after a reset."""
    cap_s = initial_s * cap_factor
    backoff = Backoff(initial_s, cap_s, random.Random(seed))
    for n in range(failures):
        delay = backoff.next_delay_s()
        assert 0.0 <= delay <= min(cap_s, initial_s * 2.0 ** min(n, 64))
    backoff.reset()
    assert 0.0 <= backoff.next_delay_s() <= initial_s


def test_backoff_survives_extreme_failure_counts_with_a_huge_initial_delay() -> None:
    """No overflow: a huge initial delay times 2ⁿ is still capped, after 10,000 failures."""
    backoff = Backoff(1e300, 60.0, UpperBound())
    assert {backoff.next_delay_s() for _ in range(10_000)} == {60.0}
