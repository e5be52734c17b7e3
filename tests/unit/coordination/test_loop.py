"""The dual loop against DESIGN.md "Coordination": hints wake it, the long loop forces it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

import pytest

from corral.coordination.loop import DualLoop
from corral.coordination.tasks import Task, TaskRun
from corral.infra.hints.memory import MemoryHintBus, MemoryHintHub
from corral.infra.locks import Hold, LockUnavailableError
from corral.infra.locks.memory import MemoryLockManager
from tests._hint_buses import WaitRecorder

HINT = "schedule"
LOCK = "schedule-lock"
NEVER_S = 3600.0  # an interval no test waits for


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Return as soon as `predicate()` holds; fail the test if it does not within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"condition still false after {timeout_s} s"
        await asyncio.sleep(0.001)


class FakeClock:
    """The loop's clock, moved by hand: the long loop comes due only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A task's run: counts calls, raises the queued errors first, can hold a run open."""

    def __init__(self, *errors: BaseException, changes: int = 1) -> None:
        self.calls = 0
        self.changes = changes  # sessions each run reports moved
        self.errors = list(errors)
        self.started = asyncio.Event()
        self.gate: asyncio.Event | None = None  # when set, each run waits for it
        self.during_run: Callable[[], Any] | None = None  # awaited inside each run
        self.due_in_s: float | None = None  # what each run reports as its next due time

    async def __call__(self) -> TaskRun:
        self.calls += 1
        self.started.set()
        if self.during_run is not None:
            await self.during_run()
        if self.gate is not None:
            await self.gate.wait()
        if self.errors:
            raise self.errors.pop(0)
        return TaskRun(task=HINT, targets=self.calls, changed=self.changes, due_in_s=self.due_in_s)


def make_loop(
    recorder: Recorder,
    hints: MemoryHintBus,
    locks: MemoryLockManager | None = None,
    *,
    lock: str | None = LOCK,
    **intervals: Any,
) -> DualLoop:
    """A loop over one task named and hinted "schedule"; unless asked, without the run at start
    (the tests count runs from hints and intervals)."""
    task = Task(name=HINT, hint=HINT, run=recorder, lock=lock)
    intervals.setdefault("run_at_start", False)
    return DualLoop(task, hints, locks or MemoryLockManager(), **intervals)


@asynccontextmanager
async def running(loop: DualLoop) -> AsyncIterator[asyncio.Task[None]]:
    """Run `loop` in the background; stop it on exit and surface any crash."""
    task = asyncio.create_task(loop.run())
    await eventually(lambda: loop.running)  # its long deadline is now set from the clock
    try:
        yield task
    finally:
        loop.stop()
        await asyncio.wait_for(task, 5)


async def is_set(hints: MemoryHintBus, name: str = HINT) -> bool:
    """Whether the hint is set, without clearing it."""
    return await hints.wait([name], 0)


async def test_a_pushed_hint_runs_the_task_at_once() -> None:
    """A pushed hint runs the task without waiting for a tick, and is consumed by the run."""
    hints, recorder = MemoryHintBus(), Recorder()
    loop = make_loop(recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        assert loop.last_run == TaskRun(task=HINT, targets=1, changed=1)
        assert not await is_set(hints)
        assert loop.forced_runs == 0


async def test_a_burst_of_hints_during_the_debounce_is_one_run() -> None:
    """While the task is busy, hints pushed during the debounce are served by a single run."""
    hints, recorder = MemoryHintBus(), Recorder()
    loop = make_loop(
        recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S, debounce_s=0.5
    )
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)  # busy from now on
        await hints.set(HINT)
        await eventually(lambda: loop.wakes == 2)
        assert loop.runs == 1  # still debouncing
        await hints.set(HINT)
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 2)
        assert not await is_set(hints)
    assert recorder.calls == 2


async def test_a_hint_after_a_run_that_moved_nothing_runs_without_debounce() -> None:
    """A run that found nothing to do starts no burst: the next hint runs at once.

    A promotion is woken once when its sessions enter the phase (their kernels are not ready
    yet) and again when the agents answer; the second hint must not wait out a debounce.
    """
    hints, recorder = MemoryHintBus(), Recorder(changes=0)
    loop = make_loop(
        recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S, debounce_s=NEVER_S
    )
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 2)


async def test_a_hint_after_a_quiet_spell_runs_without_debounce() -> None:
    """The first hint of a quiet task runs at once: a lone submission pays no debounce."""
    hints, recorder = MemoryHintBus(), Recorder()
    loop = make_loop(
        recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S, debounce_s=NEVER_S
    )
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)


async def test_a_hint_one_debounce_after_a_busy_run_runs_at_once() -> None:
    """Only a hint within one debounce period of a run that moved something is a burst's.

    Steady arrivals slower than that (100 submissions/s against 1 ms runs) are not a burst,
    and each would otherwise pay the whole debounce at every phase.
    """
    hints, recorder, clock = MemoryHintBus(), Recorder(), FakeClock()
    loop = make_loop(
        recorder,
        hints,
        short_interval_s=NEVER_S,
        long_interval_s=NEVER_S,
        debounce_s=100.0,
        clock=clock,
    )
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        clock.now = 150.0  # 1.5 debounce periods later
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 2)


async def test_a_hint_set_during_a_run_brings_the_next_run_at_once() -> None:
    """The loop checks the hint right after a run instead of sleeping to the next tick."""
    hints, recorder = MemoryHintBus(), Recorder()

    async def set_hint_on_first_run() -> None:
        if recorder.calls == 1:
            await hints.set(HINT)

    recorder.during_run = set_hint_on_first_run
    loop = make_loop(recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 2)


async def test_without_a_hint_the_short_loop_never_runs_the_task() -> None:
    """Short ticks with no hint set only check the hint; the task does not run."""
    hints, recorder = MemoryHintBus(), Recorder()
    loop = make_loop(recorder, hints, short_interval_s=0.01, clock=FakeClock())
    async with running(loop):
        await eventually(lambda: loop.attempts >= 5)
    assert (loop.runs, recorder.calls) == (0, 0)


@pytest.mark.parametrize("lossless", [True, False])
async def test_an_idle_loop_ticks_only_where_a_hint_can_be_lost(lossless: bool) -> None:
    """On an in-process bus (no hint lost) an idle loop waits for its next due moment, here the
    long loop; on a bus whose notifications can be lost it looks every short interval; a set
    hint runs the task at once either way."""
    hints, recorder = WaitRecorder(lossless=lossless), Recorder()
    loop = make_loop(recorder, hints, short_interval_s=0.01, long_interval_s=NEVER_S)
    async with running(loop):
        await eventually(lambda: len(hints.timeouts) >= 1)
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
    first = hints.timeouts[0]
    if lossless:
        assert first > NEVER_S - 60  # not a tick: the long loop's hour, less what has passed
    else:
        assert first == pytest.approx(0.01)


async def test_an_injected_clock_is_looked_at_every_short_tick() -> None:
    """A lossless bus, but a clock no timer follows: the loop ticks to see it move."""
    hints, recorder = WaitRecorder(lossless=True), Recorder()
    loop = make_loop(recorder, hints, short_interval_s=0.01, clock=FakeClock())
    async with running(loop):
        await eventually(lambda: len(hints.timeouts) >= 3)
    assert hints.timeouts[0] == pytest.approx(0.01)


async def test_the_long_loop_runs_the_task_every_long_interval() -> None:
    """Each long interval forces one run with no hint; between them nothing runs."""
    hints, recorder, clock = MemoryHintBus(), Recorder(), FakeClock()
    loop = make_loop(recorder, hints, short_interval_s=0.01, long_interval_s=60, clock=clock)
    async with running(loop):
        await eventually(lambda: loop.attempts >= 2)
        assert loop.runs == 0
        clock.now = 60
        await eventually(lambda: loop.forced_runs == 1)
        attempts = loop.attempts
        await eventually(lambda: loop.attempts >= attempts + 3)
        assert loop.forced_runs == 1  # the deadline moved on to 120
        clock.now = 120
        await eventually(lambda: loop.forced_runs == 2)
    assert loop.runs == 2


async def test_a_forced_run_consumes_a_set_hint() -> None:
    """A forced run that finds the hint set clears it, so the task does not run twice in a row."""
    hints, recorder, clock = MemoryHintBus(), Recorder(), FakeClock()
    loop = make_loop(recorder, hints, short_interval_s=0.01, long_interval_s=60, clock=clock)
    async with running(loop):
        clock.now = 60
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        attempts = loop.attempts
        await eventually(lambda: loop.attempts >= attempts + 3)
    assert (loop.runs, loop.forced_runs) == (1, 1)
    assert not await is_set(hints)


async def test_a_busy_lock_leaves_the_hint_set_until_the_lock_is_free() -> None:
    """While another holder has the lock the task does not run and the hint stays set."""
    hints, locks, recorder = MemoryHintBus(), MemoryLockManager(), Recorder()
    loop = make_loop(recorder, hints, locks, short_interval_s=0.01, clock=FakeClock())
    async with running(loop):
        async with locks.hold(LOCK) as held:
            assert held
            await hints.set(HINT)
            await eventually(lambda: loop.lock_busy >= 2)
            assert loop.runs == 0
            assert await is_set(hints)
        await eventually(lambda: loop.runs == 1)
        assert not await is_set(hints)


async def lock_is_free(locks: MemoryLockManager, name: str = LOCK) -> bool:
    """Whether `name` could be taken right now (taken and given back at once if so)."""
    async with locks.hold(name) as held:
        return held


def hinted_loop(
    lock_linger_s: float, hints: MemoryHintBus | None = None
) -> tuple[MemoryHintBus, MemoryLockManager, DualLoop]:
    """A loop that runs only when hinted (no tick, no long loop), lingering `lock_linger_s`."""
    hints, locks = hints or MemoryHintBus(), MemoryLockManager()
    loop = make_loop(
        Recorder(),
        hints,
        locks,
        short_interval_s=NEVER_S,
        long_interval_s=NEVER_S,
        lock_linger_s=lock_linger_s,
    )
    return hints, locks, loop


async def hint_and_run(hints: MemoryHintBus, loop: DualLoop) -> None:
    """Set the loop's hint and return once it has run once more."""
    runs = loop.runs
    await hints.set(HINT)
    await eventually(lambda: loop.runs == runs + 1)


async def test_hints_within_the_linger_run_under_the_same_hold() -> None:
    """A burst is served under one hold of the lock, kept between its runs."""
    hints, locks, loop = hinted_loop(lock_linger_s=NEVER_S)
    async with running(loop):
        for _ in range(3):
            await hint_and_run(hints, loop)
            assert not await lock_is_free(locks)  # kept for the next hint
        assert loop.lock_holds == 1
    assert await lock_is_free(locks)  # stopping the loop ended the hold


async def test_while_the_loop_holds_the_lock_its_hints_stay_in_the_process() -> None:
    """A hint set here for a task whose lock the loop holds wakes it without leaving the process;
    once the hold ends, hints go to every manager again."""
    hub = MemoryHintHub()
    other_manager = MemoryHintBus(hub=hub)
    hints, _, loop = hinted_loop(lock_linger_s=NEVER_S, hints=MemoryHintBus(hub=hub))
    async with running(loop):
        await hint_and_run(hints, loop)
        await hints.set(HINT)  # lingering under the lock: kept here
        assert not await is_set(other_manager)
        await eventually(lambda: loop.runs == 2)
    await hints.set(HINT)
    assert await is_set(other_manager)


async def test_the_lock_is_given_back_after_the_linger_without_a_hint() -> None:
    """No hint within the linger ends the hold; the next hint takes the lock afresh."""
    hints, locks, loop = hinted_loop(lock_linger_s=0.05)
    async with running(loop):
        await hint_and_run(hints, loop)
        # Polled with a deadline: the linger is the loop's own timeout, not a wait in the test.
        deadline = asyncio.get_running_loop().time() + 5
        while not await lock_is_free(locks):
            assert asyncio.get_running_loop().time() < deadline, "the hold never ended"
            await asyncio.sleep(0.001)
        assert loop.lock_holds == 1
        await hint_and_run(hints, loop)
        assert loop.lock_holds == 2


async def test_without_a_linger_every_run_takes_the_lock_afresh() -> None:
    """lock_linger_s=0 gives the lock back after each run."""
    hints, locks, loop = hinted_loop(lock_linger_s=0)
    async with running(loop):
        for holds in (1, 2, 3):
            await hint_and_run(hints, loop)
            await eventually(lambda: loop.lock_holds == holds)  # noqa: B023
        assert await lock_is_free(locks)


async def test_a_lingering_hold_ends_when_the_long_loop_comes_due() -> None:
    """The long loop's forced run is not swallowed by a hold: it comes, and takes the lock."""
    hints, locks, recorder, clock = MemoryHintBus(), MemoryLockManager(), Recorder(), FakeClock()
    loop = make_loop(
        recorder,
        hints,
        locks,
        short_interval_s=0.01,
        long_interval_s=60,
        lock_linger_s=NEVER_S,
        clock=clock,
    )
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        clock.now = 60
        await eventually(lambda: loop.forced_runs == 1)
        assert (loop.runs, loop.lock_holds) == (2, 2)


async def test_a_forced_run_that_finds_the_lock_busy_is_owed_until_it_runs() -> None:
    """The lock's holder may only be lingering for hints, or be a killed manager whose lock has
    not expired: a forced run that finds the lock held is tried again soon and runs once the
    lock is free, with no hint."""
    hints, locks, recorder, clock = MemoryHintBus(), MemoryLockManager(), Recorder(), FakeClock()
    loop = make_loop(recorder, hints, locks, short_interval_s=0.01, long_interval_s=60, clock=clock)
    async with running(loop):
        async with locks.hold(LOCK):
            clock.now = 60
            await eventually(lambda: loop.lock_busy >= 1)
            clock.now = 61  # past the busy retry, still held
            busy = loop.lock_busy
            await eventually(lambda: loop.lock_busy > busy)
            assert recorder.calls == 0
        clock.now = 62
        await eventually(lambda: recorder.calls == 1)
        attempts = loop.attempts
        await eventually(lambda: loop.attempts >= attempts + 3)
    assert recorder.calls == 1  # owed once, run once


async def test_a_loop_runs_its_task_once_at_start() -> None:
    """A (re)started manager owes every task a run: the hints it consumed before it was killed
    are gone. With hour-long intervals and no hint, the task still runs once at start, then
    waits."""
    hints, recorder = MemoryHintBus(), Recorder()
    loop = make_loop(
        recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S, run_at_start=True
    )
    async with running(loop):
        await eventually(lambda: loop.forced_runs == 1)
        await asyncio.sleep(0)  # one more turn of the loop: nothing else is due
    assert recorder.calls == 1


async def test_a_failing_run_is_logged_counted_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run that raises does not stop the loop; its work is retried after a short interval."""
    hints, recorder = MemoryHintBus(), Recorder(RuntimeError("database is down"))
    loop = make_loop(recorder, hints, short_interval_s=0.01, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="corral.coordination.loop"):
        async with running(loop):
            await hints.set(HINT)
            await eventually(lambda: loop.runs == 1)
    assert loop.failures == 1
    assert loop.forced_runs == 0  # the retry needed neither a new hint nor the long loop
    [record] = [r for r in caplog.records if r.getMessage() == "coordinator.task_failed"]
    assert (record.task, record.error) == (HINT, "RuntimeError")  # type: ignore[attr-defined]


async def test_with_the_hint_bus_closed_the_task_runs_every_short_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dead hint bus means "a hint may have been lost": the task runs every short tick (not
    only every long one), the long loop still runs, and the outage is logged once."""
    hints, recorder, clock = MemoryHintBus(), Recorder(), FakeClock()
    await hints.close()
    loop = make_loop(recorder, hints, short_interval_s=0.01, long_interval_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="corral.coordination.loop"):
        async with running(loop):
            await eventually(lambda: loop.runs >= 3)
            assert loop.forced_runs == 0
            clock.now = 60
            await eventually(lambda: loop.forced_runs == 1)
    assert caplog.messages.count("coordinator.hints_unavailable") == 1


async def test_a_reported_due_time_runs_the_task_then_without_a_hint() -> None:
    """A run that says work comes due in 5 s is followed by a run at that time, not before,
    with no hint and no long loop; that run's own report (nothing due) ends it."""
    hints, recorder, clock = MemoryHintBus(), Recorder(), FakeClock()
    recorder.due_in_s = 5.0
    loop = make_loop(recorder, hints, short_interval_s=0.01, long_interval_s=60, clock=clock)
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        recorder.due_in_s = None
        clock.now = 4.9
        attempts = loop.attempts
        await eventually(lambda: loop.attempts >= attempts + 3)
        assert loop.runs == 1
        clock.now = 5.0
        await eventually(lambda: loop.runs == 2)
        assert (loop.due_runs, loop.forced_runs) == (1, 0)
        attempts = loop.attempts
        await eventually(lambda: loop.attempts >= attempts + 3)
    assert loop.runs == 2


async def test_a_due_time_shortens_the_wait_of_an_hour_long_tick() -> None:
    """The loop sleeps until the due time, not its short or long interval (both an hour)."""
    hints, recorder = MemoryHintBus(), Recorder()
    recorder.due_in_s = 0.05
    loop = make_loop(recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        recorder.due_in_s = None
        await eventually(lambda: loop.runs == 2)
    assert loop.due_runs == 1


async def test_a_due_run_that_finds_the_lock_busy_tries_again_soon() -> None:
    """A due time met with the lock held elsewhere is not dropped: the run comes once the
    lock is free, without a hint."""
    hints, locks, recorder, clock = MemoryHintBus(), MemoryLockManager(), Recorder(), FakeClock()
    recorder.due_in_s = 1.0
    loop = make_loop(
        recorder,
        hints,
        locks,
        short_interval_s=0.01,
        long_interval_s=60,
        lock_linger_s=0,
        clock=clock,
    )
    async with running(loop):
        await hints.set(HINT)
        await eventually(lambda: loop.runs == 1)
        recorder.due_in_s = None
        async with locks.hold(LOCK) as held:
            assert held
            clock.now = 1.0
            await eventually(lambda: loop.lock_busy >= 1)
            clock.now = 2.0  # past the busy retry
        await eventually(lambda: loop.runs == 2)
    assert loop.due_runs == 1


class UnreachableLocks(MemoryLockManager):
    """A lock manager whose server is down until `restore()`: every hold() raises."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[Hold]:
        """Raise LockUnavailableError while down, else take the in-process lock."""
        if self.down:
            raise LockUnavailableError("the lock server is down")
        async with super().hold(name) as held:
            yield held


async def test_with_the_lock_server_down_hinted_runs_go_on_unlocked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lock that cannot be reached does not stop the task: it runs unlocked, outage logged
    once, and takes the lock again once the server is back."""
    hints, locks, recorder = MemoryHintBus(), UnreachableLocks(), Recorder()
    loop = make_loop(recorder, hints, locks, short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    with caplog.at_level(logging.INFO, logger="corral.coordination.loop"):
        async with running(loop):
            for runs in (1, 2):
                await hints.set(HINT)
                await eventually(lambda runs=runs: loop.runs == runs)
            assert (loop.unlocked_runs, loop.lock_holds, loop.failures) == (2, 0, 0)
            locks.down = False
            await hints.set(HINT)
            await eventually(lambda: loop.runs == 3)
            assert (loop.unlocked_runs, loop.lock_holds) == (2, 1)
    assert caplog.messages.count("coordinator.locks_unavailable") == 1
    assert caplog.messages.count("coordinator.locks_restored") == 1


async def test_stop_is_idempotent_and_ends_an_idle_loop_at_once() -> None:
    """stop() wakes a loop waiting out an hour-long interval; calling it again is harmless."""
    loop = make_loop(Recorder(), MemoryHintBus(), short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    async with running(loop):
        loop.stop()
    assert not loop.running


class _DeafHints(MemoryHintBus):
    """A hint bus whose wait does not give way to a cancellation, as redis-py has lost one
    that came during a command: it goes on waiting (until a hint is set)."""

    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        with contextlib.suppress(asyncio.CancelledError):
            return await super().wait(names, timeout_s)
        return await super().wait(names, timeout_s)


async def test_stop_ends_an_idle_loop_whose_hint_wait_ignores_cancellation() -> None:
    """stop() does not depend on the hint bus's wait giving way: the loop returns at once."""
    hints = _DeafHints()
    loop = make_loop(Recorder(), hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    task = asyncio.create_task(loop.run())
    await eventually(lambda: loop._idle_task is not None)  # waiting on the bus
    idle = loop._idle_task
    loop.stop()
    await asyncio.wait_for(task, 5)
    assert not loop.running
    await hints.set(HINT)  # a deaf wait still going ends, so nothing is left behind
    assert idle is not None
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(idle, 5)


async def test_stop_before_run_makes_run_return_at_once() -> None:
    """A loop stopped before it started returns from run() without running the task."""
    hints, recorder = MemoryHintBus(), Recorder()
    await hints.set(HINT)
    loop = make_loop(recorder, hints)
    loop.stop()
    await asyncio.wait_for(loop.run(), 5)
    assert recorder.calls == 0


async def test_stop_lets_the_run_in_progress_finish() -> None:
    """stop() during a run waits for it to complete instead of cancelling it."""
    hints, recorder = MemoryHintBus(), Recorder()
    recorder.gate = asyncio.Event()
    loop = make_loop(recorder, hints, short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    task = asyncio.create_task(loop.run())
    await hints.set(HINT)
    await recorder.started.wait()
    loop.stop()
    recorder.gate.set()
    await asyncio.wait_for(task, 5)
    assert loop.runs == 1


class Boom(BaseException):
    """Not an Exception: the loop must not swallow it."""


async def test_a_base_exception_from_the_task_ends_the_loop_and_frees_the_lock() -> None:
    """Only Exceptions count as failed runs; anything else propagates out of run()."""
    hints, locks, recorder = MemoryHintBus(), MemoryLockManager(), Recorder(Boom())
    await hints.set(HINT)
    loop = make_loop(recorder, hints, locks)
    with pytest.raises(Boom):
        await asyncio.wait_for(loop.run(), 5)
    assert not loop.running
    async with locks.hold(LOCK) as held:
        assert held


async def test_run_twice_at_once_is_an_error() -> None:
    """One loop drives its task once: a second concurrent run() is refused."""
    loop = make_loop(Recorder(), MemoryHintBus(), short_interval_s=NEVER_S, long_interval_s=NEVER_S)
    async with running(loop):
        await eventually(lambda: loop.running)
        with pytest.raises(RuntimeError, match="already running"):
            await loop.run()


@pytest.mark.parametrize(
    ("intervals", "message"),
    [
        ({"short_interval_s": 0}, "short_interval_s must be > 0"),
        ({"long_interval_s": -1}, "long_interval_s must be > 0"),
        ({"short_interval_s": 5, "long_interval_s": 1}, "must not exceed long_interval_s"),
        ({"debounce_s": -0.1}, "debounce_s must be >= 0"),
        ({"lock_linger_s": -1}, "lock_linger_s must be >= 0"),
        ({"short_interval_s": float("nan")}, "short_interval_s must be > 0"),
    ],
)
def test_bad_intervals_are_refused_by_name(intervals: dict[str, Any], message: str) -> None:
    """Each invalid interval is reported with the name of the parameter at fault."""
    with pytest.raises(ValueError, match=message):
        make_loop(Recorder(), MemoryHintBus(), **intervals)


async def test_a_forced_run_that_found_nothing_gives_the_lock_back_at_once() -> None:
    """The long loop's run of an idle task does not linger for hints (a hinted run after it
    does); a forced run that found work lingers."""
    for targets in (0, 1):
        hints, locks = MemoryHintBus(), MemoryLockManager()

        async def run(targets: int = targets) -> TaskRun:
            return TaskRun(task=HINT, targets=targets)

        loop = DualLoop(
            Task(name=HINT, hint=HINT, run=run, lock=LOCK),
            hints,
            locks,
            short_interval_s=NEVER_S,
            long_interval_s=NEVER_S,
            lock_linger_s=NEVER_S,
        )
        async with running(loop):
            await eventually(lambda loop=loop: loop.forced_runs == 1)
            if targets:
                assert not await lock_is_free(locks)
                continue
            deadline = asyncio.get_running_loop().time() + 5
            while not await lock_is_free(locks):
                assert asyncio.get_running_loop().time() < deadline, "the hold never ended"
                await asyncio.sleep(0.001)
            await hints.set(HINT)
            await eventually(lambda loop=loop: loop.runs == 2)
            assert not await lock_is_free(locks)  # a hinted run lingers
