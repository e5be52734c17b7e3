"""The dual loop that drives one coordinator task: a short loop woken by hints, a long loop forced.

Short loop: every `short_interval_s`, or as soon as the task's hint is pushed, run the task if
the hint could be consumed (or, while the hint bus is down, whether a hint was set is unknown:
run it every short tick). On a bus that loses no hint (`HintBus.lossless`, in-process) an idle
loop has nothing to look at between its due moments and does not tick. While the task is busy (a
run of it moved something within the last debounce period) a pushed hint is debounced first, so
a burst of hints becomes one batch; a hint after a quiet spell, or after a run that found
nothing to do (a promotion woken before the agents answered), runs at once, so a lone submission
pays no debounce at any phase. Long loop: at start and every `long_interval_s` after, run the
task whatever the hints say (a forced run that finds the lock held is retried until it runs). A
lost hint or a dead hint bus costs latency, never correctness (DESIGN.md, "Coordination"). Due
times: a run may report when the task next has work that no hint will announce
(`TaskRun.due_in_s`: a phase timeout, a start time, a deadline); the loop wakes then and runs
the task, so time-driven work is done within moments of its due time rather than at the long
loop.

The task's lock is taken before a run and kept while hints keep coming: a hint within
`lock_linger_s` of the last run is served under the same hold, so a busy task does not pay a
take and a release (two round trips to the lock's server) per run. A forced or due run that
found nothing to look at gives the lock back at once: no burst is under way, and lingering would
cost an idle manager two more wake-ups per task every long interval. A manager that finds the
lock held leaves the hint to the holder, which is waiting for it; the hold ends after
`lock_linger_s` without a hint, on stop, or when the long loop comes due. While it holds the
lock the loop claims the task's hint on the bus, so hints set in this manager for the task
stay in the process (`ClaimableHintBus`). A hold found lost (its renewal failed) ends at once.

When the lock's server cannot be reached, the loop runs the task without the lock (the outage
logged once): its writes are guarded, so the lock only spares a second manager a run that
would change nothing, and a Redis outage must not stop every session (issue 32, defect 4).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from corral.coordination.tasks import Task, TaskRun
from corral.infra._outage import OutageLog
from corral.infra.hints import HintBus, HintBusError
from corral.infra.locks import Hold, LockManager, LockManagerClosedError, LockUnavailableError
from corral.store.unavailable import database_unavailable

__all__ = ["DualLoop"]

logger = logging.getLogger(__name__)

# After a due run that found the task's lock held elsewhere, try again this soon: the holder
# may be lingering for hints rather than running the task.
DUE_BUSY_RETRY_S = 0.25

# A hint within this many debounce periods of a run that moved something is part of a burst.
# One: a saturated task finds its next hint set as it finishes a run and batches; steady
# arrivals a little slower than the debounce (100/s against 1 ms runs) pay nothing.
BURST_WINDOW = 1

_T = TypeVar("_T")


class _Outcome(enum.Enum):
    RAN = "ran"
    SKIPPED = "skipped"  # no hint, not forced: nothing to do
    BUSY = "busy"  # someone else holds the task's lock, so they run it
    FAILED = "failed"  # the run (or taking its lock) raised


class DualLoop:
    """Runs one task when its hint is set (short loop) and every long interval (long loop)."""

    def __init__(
        self,
        task: Task,
        hints: HintBus,
        locks: LockManager,
        *,
        short_interval_s: float = 2.0,
        long_interval_s: float = 60.0,
        debounce_s: float = 0.005,
        lock_linger_s: float = 1.0,
        run_at_start: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not short_interval_s > 0:
            raise ValueError(f"short_interval_s must be > 0 seconds, got {short_interval_s!r}")
        if not long_interval_s > 0:
            raise ValueError(f"long_interval_s must be > 0 seconds, got {long_interval_s!r}")
        if short_interval_s > long_interval_s:
            raise ValueError(
                f"short_interval_s ({short_interval_s!r}) must not exceed "
                f"long_interval_s ({long_interval_s!r}); the long loop is the slow safety net"
            )
        if not debounce_s >= 0:
            raise ValueError(f"debounce_s must be >= 0 seconds (0 disables it), got {debounce_s!r}")
        if not lock_linger_s >= 0:
            raise ValueError(
                f"lock_linger_s must be >= 0 seconds (0 releases after every run), "
                f"got {lock_linger_s!r}"
            )
        self.task = task
        self._hints = hints
        self._locks = locks
        self._short_interval_s = short_interval_s
        self._long_interval_s = long_interval_s
        self._debounce_s = debounce_s
        self._lock_linger_s = lock_linger_s
        self._run_at_start = run_at_start
        self._clock = clock
        # Counters for metrics and tests. `runs` counts completed runs, forced ones included.
        self.runs = 0
        self.forced_runs = 0  # completed runs the long loop forced
        self.due_runs = 0  # completed runs made because a due time came
        self.failures = 0  # runs (or lock attempts) that raised
        self.attempts = 0  # times the loop decided whether to run (a hint check or a forced run)
        self.wakes = 0  # times a set hint woke the short loop
        self.lock_busy = 0  # attempts that found the task's lock held elsewhere
        self.lock_holds = 0  # times the task's lock was taken (a hold may serve several runs)
        self.last_run: TaskRun | None = None
        self._running = False
        self._stopping = False
        self._idle_task: asyncio.Task[Any] | None = None
        # Done once stop() is called: an idle wait ends on it even if the hint bus's wait does
        # not give way to its cancellation (redis-py has lost a cancellation that came during a
        # command: the loop then waited out its tick, 10 s and more, before it could stop).
        self._stop_signal: asyncio.Future[None] | None = None
        # The hint bus's outages, logged once each; while one lasts the loop only ticks.
        self._hints_outage = OutageLog(
            logger, "coordinator.hints_unavailable", "coordinator.hints_restored"
        )
        # The lock server's outages, logged once each; while one lasts runs go unlocked.
        self._locks_outage = OutageLog(
            logger, "coordinator.locks_unavailable", "coordinator.locks_restored"
        )
        self.unlocked_runs = 0  # attempts run without the lock because its server was down
        # The database's outages, logged once each; the failed runs are retried meanwhile.
        self._database_outage = OutageLog(
            logger, "coordinator.database_unavailable", "coordinator.database_restored"
        )
        self._last_worked_at: float | None = None  # clock() when a run that moved sessions ended
        self._next_forced_at = 0.0  # clock() when the long loop is next due
        self._due_at: float | None = None  # clock() when the last run said work comes due
        # Idle on a bus that loses no hint, timed by the event loop's own clock, the loop has
        # nothing to look at before its next due moment (the long loop, a due time), so it
        # sleeps until then. Else it looks every short interval: at the server, for a hint
        # whose notification was lost; at an injected clock, which no timer follows.
        self._ticks = not (hints.lossless and clock is time.monotonic)

    async def run(self) -> None:
        """Drive the task until stop(); a run raising an Exception is logged and retried."""
        if self._running:
            raise RuntimeError(f"the loop of task {self.task.name!r} is already running")
        self._running = True
        # A manager (re)started owes each task a run: the hints it consumed before a crash are
        # gone, and with managers restarting more often than the long interval, a long loop
        # counted from start would never come (issue 32, the chaos run with kills every 5 s).
        self._next_forced_at = self._clock() + (
            0.0 if self._run_at_start else self._long_interval_s
        )
        pause = False  # after a failure or a busy lock: wait, don't answer a set hint at once
        retry = False  # a failed run's work is still owed, hint or not
        try:
            while not self._stopping:
                tick_s = self._short_interval_s
                if not (self._ticks or pause or self._hints_down):
                    tick_s = self._long_interval_s  # a lossless bus: until due (see _ticks)
                timeout_s = max(0.0, min(tick_s, self._until_due() - self._clock()))
                hinted = True  # unknown after a plain sleep: look (under the lock)
                if pause or self._hints_down:
                    # A hint still set would make wait() return at once: sleep, don't spin.
                    await self._idle(asyncio.sleep(timeout_s), None)
                else:
                    hinted = await self._woken(timeout_s)
                    if self._hints_down:  # the bus just failed: wait out the tick instead
                        await self._idle(asyncio.sleep(timeout_s), None)
                if self._stopping:
                    break
                forced = self._forced_due()
                due = self._due_passed()
                if not (hinted or forced or retry or due):
                    # wait() counts a hint already set, so none is: an idle tick takes no lock
                    # and sends nothing to any server.
                    self.attempts += 1
                    continue
                outcome = await self._attempt(forced=forced, retry=retry, due=due)
                # A due or forced run left to the lock's holder is owed until it happens: the
                # holder may only be lingering for hints, or be dead with its lock not yet
                # expired.
                if (due or forced) and outcome is _Outcome.BUSY and self._due_at is None:
                    self._due_at = self._clock() + DUE_BUSY_RETRY_S
                retry = outcome is _Outcome.FAILED or (retry and outcome is _Outcome.BUSY)
                pause = outcome in (_Outcome.FAILED, _Outcome.BUSY)
        finally:
            self._running = False

    def _forced_due(self) -> bool:
        """Whether the long loop is due; if so, its next time is counted from now."""
        if self._clock() < self._next_forced_at:
            return False
        # Ran, failed, or left to the lock's holder: the long loop does its part now.
        self._next_forced_at = self._clock() + self._long_interval_s
        return True

    def _until_due(self) -> float:
        """clock() when the loop must look next without a hint: the long loop or a due time."""
        if self._due_at is None:
            return self._next_forced_at
        return min(self._next_forced_at, self._due_at)

    def _due_passed(self) -> bool:
        """Whether the due time the last run reported has come (then forgotten: the due run
        reports the next one)."""
        if self._due_at is None or self._clock() < self._due_at:
            return False
        self._due_at = None
        return True

    def _busy(self) -> bool:
        """Whether the task did work moments ago: hints are coming in a burst, worth batching."""
        last = self._last_worked_at
        return last is not None and self._clock() - last < BURST_WINDOW * self._debounce_s

    @property
    def debounce_s(self) -> float:
        """How long a hint in a burst waits for more (seconds)."""
        return self._debounce_s

    @property
    def running(self) -> bool:
        """Whether run() is in progress."""
        return self._running

    def stop(self) -> None:
        """Make run() return once the run in progress (if any) is done; idempotent."""
        self._stopping = True
        if self._idle_task is not None:
            self._idle_task.cancel()
        if self._stop_signal is not None and not self._stop_signal.done():
            self._stop_signal.set_result(None)

    async def _attempt(self, *, forced: bool, retry: bool, due: bool = False) -> _Outcome:
        self.attempts += 1
        lock = self.task.lock
        if lock is None:
            return await self._consume_and_run(forced=forced, retry=retry, due=due)
        try:
            # The lock before the hint: a manager that cannot run the task must leave the hint
            # set for the one that can.
            async with self._locks.hold(lock) as held:
                self._locks_outage.success(self._log_fields())
                if not held:
                    self.lock_busy += 1
                    return _Outcome.BUSY
                self.lock_holds += 1
                # Held: the hints set in this process for the task need not leave it.
                self._hints.claim(self.task.hint)
                try:
                    outcome = await self._consume_and_run(forced=forced, retry=retry, due=due)
                    if (forced or due) and self._found_nothing(outcome):
                        return outcome  # an idle task's own run: no burst to linger for
                    # Linger: the next hints of a burst are served under this hold.
                    while outcome is not _Outcome.FAILED and await self._woken_while_held(held):
                        outcome = await self._consume_and_run(
                            forced=self._forced_due(), retry=False
                        )
                    return outcome
                finally:
                    await self._release_claim()
        except LockManagerClosedError:
            raise  # closed under a running loop: a shutdown-order bug, not a transient failure
        except LockUnavailableError as exc:
            # Raised only by taking the lock (the run's own errors end in _consume_and_run).
            self._locks_outage.failure(self._log_fields(exc))
            self.unlocked_runs += 1
            return await self._consume_and_run(forced=forced, retry=retry, due=due)
        except Exception as exc:
            # The lock's server is down: like a failed run, retried after a short interval.
            self.failures += 1
            logger.warning("coordinator.lock_failed", extra=self._log_fields(exc), exc_info=exc)
            return _Outcome.FAILED

    def _found_nothing(self, outcome: _Outcome) -> bool:
        """Whether the run just made had no target at all."""
        run = self.last_run
        return outcome is _Outcome.RAN and run is not None and not (run.targets or run.changed)

    async def _consume_and_run(self, *, forced: bool, retry: bool, due: bool = False) -> _Outcome:
        # Consumed even when forced, so the run does not repeat right after for the same hint.
        hinted = await self._consume()
        if not (hinted or forced or retry or due):
            return _Outcome.SKIPPED
        try:
            result = await self.task.run()
        except Exception as exc:
            self._last_worked_at = self._clock()
            self.failures += 1
            if database_unavailable(exc):
                # An outage fails every run until it ends: said once, not every tick.
                self._database_outage.failure(self._log_fields(exc))
            else:
                logger.warning("coordinator.task_failed", extra=self._log_fields(exc), exc_info=exc)
            return _Outcome.FAILED
        self._database_outage.success(self._log_fields())
        if result.changed:
            self._last_worked_at = self._clock()
        self.runs += 1
        if forced:
            self.forced_runs += 1
        elif due:
            self.due_runs += 1
        # The run saw the current state: its due time replaces any earlier one.
        self._due_at = None if result.due_in_s is None else self._clock() + result.due_in_s
        self.last_run = result
        logger.debug(
            "coordinator.task_ran",
            extra={
                **self._log_fields(),
                "forced": forced,
                "targets": result.targets,
                "changed": result.changed,
                "duration_ms": result.duration_ms,
            },
        )
        return _Outcome.RAN

    async def _woken(self, timeout_s: float) -> bool:
        """Whether the hint is set (or was pushed) within `timeout_s`, debounced when busy.

        False when the hint bus fails (then `_hints_down` is set) or the loop is stopping.
        """
        try:
            woken = await self._idle(self._hints.wait([self.task.hint], timeout_s), False)
        except HintBusError as exc:
            self._hints_failed(exc)
            return False
        self._hints_working()
        if not woken or self._stopping:
            return False
        self.wakes += 1
        if self._busy():
            await self._idle(asyncio.sleep(self._debounce_s), None)
        return not self._stopping

    async def _woken_while_held(self, held: Hold) -> bool:
        """Whether a hint came within the linger, so the run goes on under the same hold.

        Not once the long loop or a due time comes (that run takes the lock afresh), the hint
        bus is down, the hold was lost, or the loop is stopping.
        """
        until = min(self._clock() + self._lock_linger_s, self._until_due())
        while not (self._stopping or self._hints_down or held.lost):
            # In short ticks, like the loop itself, so the clock is looked at as often.
            remaining_s = until - self._clock()
            if remaining_s <= 0:
                break
            self.attempts += 1
            if await self._woken(min(remaining_s, self._short_interval_s)):
                return True
        return False

    async def _release_claim(self) -> None:
        """End the hint's claim before the lock goes; a hint kept under it goes to the bus."""
        try:
            await self._hints.release(self.task.hint)
        except HintBusError as exc:
            self._hints_failed(exc)  # the long loop covers a hint the dead bus lost

    async def _consume(self) -> bool:
        try:
            consumed = await self._hints.consume(self.task.hint)
        except HintBusError as exc:
            # Unknown whether a hint was set (and lost with the bus): run, so that while the
            # bus is down the task still runs every short tick rather than every long one.
            self._hints_failed(exc)
            return True
        self._hints_working()
        return consumed

    async def _idle(self, waiting: Coroutine[Any, Any, _T], on_stop: _T) -> _T:
        """The result of `waiting`, or `on_stop` as soon as stop() is called."""
        if self._stopping:
            waiting.close()
            return on_stop
        if self._stop_signal is None:
            self._stop_signal = asyncio.get_running_loop().create_future()
        idle = asyncio.create_task(waiting, name=f"loop-idle-{self.task.name}")
        self._idle_task = idle
        try:
            waits: list[asyncio.Future[Any]] = [idle, self._stop_signal]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._idle_task = None
            idle.cancel()  # a no-op when done; when run() itself is cancelled, don't leave it
        if self._stopping or idle.cancelled():
            if idle.done() and not idle.cancelled():
                idle.exception()  # looked at: stopping, whatever the wait ended with
            return on_stop
        return idle.result()

    @property
    def _hints_down(self) -> bool:
        return self._hints_outage.down

    def _hints_failed(self, error: HintBusError) -> None:
        self._hints_outage.failure(self._log_fields(error))  # once per outage, not per tick

    def _hints_working(self) -> None:
        self._hints_outage.success(self._log_fields())

    def _log_fields(self, error: BaseException | None = None) -> dict[str, object]:
        fields: dict[str, object] = {"task": self.task.name, "hint": self.task.hint}
        if error is not None:
            fields["error"] = type(error).__name__
        return fields
