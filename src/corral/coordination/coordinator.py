"""The session coordinator: runs the session handlers, judges, applies, wakes what is next.

A lifecycle run: load the handler's targets in one query → `execute` → judge the result (a pure
function, `judge.py`) → apply the judged changes in one transaction (guarded writes, merged
history, attempts, the handler's own writes, the events describing every move) → set the hints
of the next phases and publish the events. A promotion run matches kernels in one query and
promotes in one transaction. Locks and timing belong to the loops (`loop.py`), not here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.coordination.due import DueTimes
from corral.coordination.hints import Hint, hints_after_moves
from corral.coordination.judge import PhaseLimits, judge
from corral.coordination.metrics import CoordinatorMetrics
from corral.coordination.promotion import PromotionStep, promote_sessions, run_promotion
from corral.coordination.quarantine import Quarantine
from corral.coordination.tasks import Task, TaskRun
from corral.domain.events import Event
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.results import SchedulingResult
from corral.domain.session import SessionWithKernels
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import Clock, SessionId, UserId, utcnow
from corral.handlers.base import LifecycleHandler, SessionPromotionHandler
from corral.handlers.sessions.admission import EvictNotReady, admission_events
from corral.handlers.sessions.prepare import PrepareSessions
from corral.handlers.sessions.promotions import PROMOTION_HANDLERS, DetectTermination
from corral.handlers.sessions.retries import DispatchRetries
from corral.handlers.sessions.schedule import QUEUE_PAGE, ScheduleNewSessions
from corral.handlers.sessions.start import StartSessions
from corral.handlers.sessions.terminate import TerminateSessions
from corral.handlers.sessions.time_limits import EnforceTimeLimits
from corral.infra.events import EventBus, publish_appended
from corral.infra.hints import HintBus
from corral.store.admission import write_evictions
from corral.store.assignments import not_ready_for_stage
from corral.store.database import Database
from corral.store.events import append_events, append_session_moves
from corral.store.group_options import group_options
from corral.store.sessions import SessionRepository
from corral.store.status_changes import (
    AppliedChanges,
    StatusChange,
    apply_changes,
    apply_changes_in,
)

# Per handler: failed attempts before giving up (the spec README's 5) and seconds in the phase
# before it expires. A PENDING session never expires unless its group sets a timeout.
DEFAULT_LIMITS: Mapping[str, PhaseLimits] = {
    ScheduleNewSessions.name(): PhaseLimits(),
    PrepareSessions.name(): PhaseLimits(timeout_s=900.0),  # image pulls can be slow
    StartSessions.name(): PhaseLimits(timeout_s=300.0),
    TerminateSessions.name(): PhaseLimits(timeout_s=300.0),
}

# A phase's limits per resource group that overrides them, and the default.
_GroupLimits = tuple[dict[str, PhaseLimits], PhaseLimits]

_HINTS: Mapping[str, Hint] = {
    ScheduleNewSessions.name(): Hint.SCHEDULE,
    PrepareSessions.name(): Hint.PREPARE,
    StartSessions.name(): Hint.START,
    TerminateSessions.name(): Hint.TERMINATE,
    "PromoteToPrepared": Hint.PROMOTE_PREPARED,
    "PromoteToRunning": Hint.PROMOTE_RUNNING,
    "DetectTermination": Hint.DETECT_TERMINATION,
    "DetectFailureBeforeRunning": Hint.DETECT_FAILURE,
    "PromoteToTerminated": Hint.PROMOTE_TERMINATED,
    EnforceTimeLimits.name(): Hint.TIME_LIMIT,
    DispatchRetries.name(): Hint.RETRY,
    EvictNotReady.name(): Hint.ADMISSION,
}
# In a burst of endings the retry task gathers this long before it decides: a retry waits its
# delay anyway, and each run is a commit (with `--retries 2` at a 5 % failure rate the task's
# commits had been 5 % of the manager's time in `corral simulate`).
RETRY_BATCH_S = 0.05
# Runs of these write agents' desired state (and may have re-asked for a failed stage).
_ASKS_AGENTS = frozenset({PrepareSessions.name(), StartSessions.name(), TerminateSessions.name()})


@dataclass(slots=True)
class _Placed:
    """What a scheduling run's placement commits did besides placing: their events, and the
    sessions they also moved on to PREPARING (asked to prepare in the same commit)."""

    events: list[Event] = field(default_factory=list)
    prepared: set[SessionId] = field(default_factory=set)


_PLACED: ContextVar[_Placed | None] = ContextVar("placed", default=None)


class SessionCoordinator:
    """The session lifecycle's handler registry and the runs the loops drive."""

    def __init__(
        self,
        db: Database,
        hints: HintBus,
        events: EventBus | None = None,
        *,
        clock: Clock = utcnow,
        limits: Mapping[str, PhaseLimits] = DEFAULT_LIMITS,
        lock_prefix: str = "sessions",
        metrics: CoordinatorMetrics | None = None,
        queue_page: int = QUEUE_PAGE,
        continue_stages: bool = True,
    ) -> None:
        self.db = db
        # Whether a commit that brings sessions to SCHEDULED or PREPARED moves them on through
        # PrepareSessions' or StartSessions' success in the same transaction (`_record_placed`,
        # `_start_prepared`); without, every hop is its task's own run (tests that stop a
        # session at SCHEDULED or PREPARED use that).
        self.continue_stages = continue_stages
        self.metrics = metrics
        self.hints = hints
        self.events = events
        self.clock = clock
        self.limits = {**DEFAULT_LIMITS, **limits}
        self.lock_prefix = lock_prefix
        self.repository = SessionRepository(db)
        self.quarantine = Quarantine(db, hints, events, clock=clock)
        self._prepare = PrepareSessions(db)
        self._start = StartSessions(db)
        self.lifecycle: tuple[LifecycleHandler, ...] = (
            ScheduleNewSessions(
                db,
                clock,
                on_placed=self._record_placed,
                on_pass=metrics.observe_placement if metrics is not None else None,
                page_size=queue_page,
                quarantine=self.quarantine,
            ),
            self._prepare,
            self._start,
            TerminateSessions(db),
        )
        self.promotions: tuple[SessionPromotionHandler, ...] = PROMOTION_HANDLERS
        self.time_limits = EnforceTimeLimits(db)
        self.admission = EvictNotReady(db)
        # Where the bus can, a run's events go out with its commit, not published after it.
        self._notify = events.commit_channel if events is not None else None
        self._due = DueTimes(db, self._group_limits)
        self.retries = DispatchRetries(db, notify=self._notify)

    def tasks(self) -> list[Task]:
        """One task per handler, each woken by its own hint and run under its own lock."""
        tasks = [self._task(h.name(), self._lifecycle_run(h)) for h in self.lifecycle]
        tasks += [self._task(h.name(), self._promotion_run(h), quick=True) for h in self.promotions]
        tasks.append(self._task(self.time_limits.name(), self.run_time_limits))
        tasks.append(self._task(self.retries.name(), self.run_retries, batch_s=RETRY_BATCH_S))
        tasks.append(self._task(self.admission.name(), self.run_admission))
        return tasks

    async def run_lifecycle(self, handler: LifecycleHandler) -> TaskRun:
        """One run of a lifecycle handler over all its current targets; the run reports when
        the task next comes due without a hint (`coordination.due`)."""
        run = await self._run_lifecycle(handler)
        due_in_s = await self._due.due_in_s(handler, self.clock())
        return run if due_in_s is None else replace(run, due_in_s=due_in_s)

    async def _run_lifecycle(self, handler: LifecycleHandler) -> TaskRun:
        started = time.perf_counter()
        name = handler.name()
        # Every group's limits (for a watching handler they say which sessions may have expired;
        # for the judge, each session's) and the handler's targets: neither depends on the
        # other, so they need not come from one snapshot.
        async with self.db.read_statements() as conn:
            group_limits = await self._group_limits(conn, name)
            if handler.reads_own_targets:
                targets = await self._expiring(conn, handler, group_limits)
            elif handler.watched_session_statuses:
                targets = await self._needing_attention(conn, handler, group_limits)
            else:
                targets = await self.repository.load(
                    handler.target_session_statuses,
                    kernel_statuses=handler.target_kernel_statuses,
                    conn=conn,
                )
        if not targets and not handler.reads_own_targets:
            return TaskRun(name)
        placed = _Placed()
        # The scheduler's commit appends its events through `_record_placed`; each loop runs in
        # its own task, so the record is per run (a context variable), never shared between runs.
        token = _PLACED.set(placed)
        try:
            result = await handler.execute(() if handler.reads_own_targets else targets)
        finally:
            _PLACED.reset(token)
        if handler.reads_own_targets:
            read = {s.id for s in result.considered}
            targets = [*result.considered, *(s for s in targets if s.id not in read)]
            if not targets:
                return TaskRun(name)
        now = self.clock()
        by_group, default = group_limits

        def limits(session: SessionWithKernels) -> PhaseLimits:
            return by_group.get(session.resource_group, default)

        changes = judge(
            phase=name,
            expected=handler.target_session_statuses,
            transitions=handler.status_transitions(),
            targets=targets,
            result=result,
            limits=limits,
            now=now,
        )
        if self.metrics is not None:
            self.metrics.observe_results(name, changes)
        if handler.commits_successes:
            changes = [c for c in changes if c.result is not SchedulingResult.SUCCESS]
        appended: list[Event] = list(placed.events)
        reasons = {sid: note.message for sid, note in result.notes.items()}

        async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
            await handler.on_applied(conn, applied)
            appended.extend(
                await self._record_moves(conn, applied.moved(), reasons, name, applied.owners)
            )

        applied = await apply_changes(self.db, changes, now, on_applied=record)
        moved = dict(applied.moved())
        if handler.commits_successes:
            moved.update(
                (
                    sid,
                    (
                        SessionStatus.PENDING,
                        SessionStatus.PREPARING
                        if sid in placed.prepared
                        else SessionStatus.SCHEDULED,
                    ),
                )
                for sid in result.successes
            )
        hints = await self._next_hints(moved)
        if name in _ASKS_AGENTS or placed.prepared:
            hints.add(Hint.ASSIGNMENTS)
        await self._post_process(hints, appended)
        return TaskRun(
            name,
            targets=len(targets),
            changed=len(moved),
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    async def run_promotion(self, handler: SessionPromotionHandler) -> TaskRun:
        """One run of a promotion handler: match kernels, promote, wake the next phase."""
        started = time.perf_counter()
        name = handler.name()
        appended: list[Event] = []
        reached: dict[SessionId, SessionStatus] = {}  # where each promoted session stopped

        async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
            moved = applied.moved()
            appended.extend(await self._record_moves(conn, moved, {}, name, applied.owners))
            reached.update((sid, after) for sid, (_, after) in moved.items())

        async def start(conn: AsyncConnection) -> None:
            appended.extend(await self._start_prepared(conn, reached))

        applied = await run_promotion(
            self.db,
            handler,
            self.clock(),
            on_applied=record,
            then=start,
            quarantine=self.quarantine,
        )
        moved = {
            sid: (before, reached.get(sid, after))
            for sid, (before, after) in applied.moved().items()
        }
        if self.metrics is not None:
            self.metrics.observe_result(name, SchedulingResult.SUCCESS, len(moved))
        await self._post_process(await self._next_hints(moved), appended)
        return TaskRun(
            name,
            targets=len(applied.sessions) + len(applied.stale),
            changed=len(moved),
            duration_ms=(time.perf_counter() - started) * 1000,
        )

    async def run_time_limits(self) -> TaskRun:
        """Stop the running sessions past their time limit; say when the next one is due."""
        started = time.perf_counter()
        name = self.time_limits.name()
        now = self.clock()
        due = await self.time_limits.due(now)
        moved: Mapping[SessionId, tuple[SessionStatus, SessionStatus]] = {}
        if due.change is not None:
            appended: list[Event] = []
            reasons = {sid: note.message for sid, note in due.change.notes.items()}

            async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
                appended.extend(
                    await self._record_moves(conn, applied.moved(), reasons, name, applied.owners)
                )

            applied = await apply_changes(self.db, [due.change], now, on_applied=record)
            moved = applied.moved()
            if self.metrics is not None:
                self.metrics.observe_result(name, SchedulingResult.SUCCESS, len(moved))
            await self._post_process(await self._next_hints(moved), appended)
        due_in_s = None
        if due.full:
            due_in_s = 0.0
        elif due.next_deadline is not None:
            due_in_s = max(0.0, (due.next_deadline - self.clock()).total_seconds())
        return TaskRun(
            name,
            targets=len(due.change.session_ids) if due.change is not None else 0,
            changed=len(moved),
            duration_ms=(time.perf_counter() - started) * 1000,
            due_in_s=due_in_s,
        )

    async def run_admission(self) -> TaskRun:
        """Evict the sessions past their KernelsReady timeouts (requeued or deactivated) and
        cancel the deactivated ones past their retention; say when the next one is due."""
        started = time.perf_counter()
        name = self.admission.name()
        now = self.clock()
        work = await self.admission.due(now)
        moved: Mapping[SessionId, tuple[SessionStatus, SessionStatus]] = {}
        if work.changes:
            appended: list[Event] = []
            reasons = {sid: n.message for c in work.changes for sid, n in c.notes.items()}

            async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
                done = applied.moved()
                await write_evictions(conn, [e for e in work.evictions if e.id in done], now)
                appended.extend(await self._record_moves(conn, done, reasons, name, applied.owners))
                events = admission_events(work, done, applied.owners, now)
                appended.extend(await append_events(conn, events, now, notify=self._notify))

            applied = await apply_changes(self.db, work.changes, now, on_applied=record)
            moved = applied.moved()
            if self.metrics is not None:
                for change in work.changes:
                    count = sum(1 for sid in change.session_ids if sid in moved)
                    self.metrics.observe_result(name, change.result, count)
            await self._post_process(await self._next_hints(moved), appended)
        if self.metrics is not None:
            causes = [cause for sid, cause in work.causes.items() if sid in moved]
            self.metrics.observe_admission(causes, work.deactivated)
        due_in_s = None
        if work.next_due is not None:
            due_in_s = max(0.0, (work.next_due - self.clock()).total_seconds())
        return TaskRun(
            name,
            targets=sum(len(c.session_ids) for c in work.changes),
            changed=len(moved),
            duration_ms=(time.perf_counter() - started) * 1000,
            due_in_s=due_in_s,
        )

    async def run_retries(self) -> TaskRun:
        """Decide the retries of the ended sessions that have a policy; create the retries."""
        started = time.perf_counter()
        done = await self.retries.dispatch(self.clock())
        if self.metrics is not None:
            self.metrics.observe_retries(done)
        hints: set[str] = {Hint.SCHEDULE} if done.children else set()
        await self._post_process(hints, done.events)
        return TaskRun(
            self.retries.name(),
            targets=done.looked_at,
            changed=len(done.children),
            duration_ms=(time.perf_counter() - started) * 1000,
            due_in_s=0.0 if done.full else None,
        )

    async def promote_reported(
        self, moves: Iterable[tuple[SessionId, KernelStatus, KernelStatus]]
    ) -> set[SessionId]:
        """Promote at once the sessions whose kernels agents just reported moving.

        `moves`: (session, kernel status before, after) of every kernel a committed report
        batch moved. Every session one of those moves can make promotable is read again and
        promoted as far as its kernels allow, in one transaction (`promote_sessions`): the
        promotion tasks would do the same a hint and a run later, one move per run. Returns
        the sessions looked at: every promotion the reports made due for them is done (or
        was not due once the reports committed), so the reports need not wake the tasks.
        """
        due: set[SessionId] = set()
        judged: dict[tuple[KernelStatus, KernelStatus], bool] = {}  # few kinds of move
        for sid, before, after in moves:
            may = judged.get((before, after))
            if may is None:
                may = judged[before, after] = any(
                    handler.may_become_due(before, after) for handler in self.promotions
                )
            if may:
                due.add(sid)
        if not due:
            return due
        appended: list[Event] = []
        ended_in: dict[SessionId, SessionStatus] = {}  # where each promoted session stopped

        async def record(
            conn: AsyncConnection, applied: AppliedChanges, step: PromotionStep
        ) -> None:
            moved = applied.moved()
            if self.metrics is not None:
                for phase, count in Counter(step.phases[sid] for sid in moved).items():
                    self.metrics.observe_result(phase, SchedulingResult.SUCCESS, count)
            appended.extend(
                await self._record_moves(conn, moved, step.phases, "promotion", applied.owners)
            )
            ended_in.update((sid, after) for sid, (_, after) in moved.items())

        async def start(conn: AsyncConnection) -> None:
            appended.extend(await self._start_prepared(conn, ended_in))

        await promote_sessions(
            self.db,
            self.promotions,
            due,
            self.clock(),
            on_step=record,
            then=start,
            quarantine=self.quarantine,
        )
        await self._post_process(hints_after_moves(ended_in.values()), appended)
        return due

    async def run_all(self) -> int:
        """Every task once, in lifecycle order; the number of sessions moved (for tests, tools)."""
        changed = 0
        for task in self.tasks():
            changed += (await task.run()).changed
        return changed

    def _task(
        self,
        name: str,
        run: Callable[[], Awaitable[TaskRun]],
        *,
        quick: bool = False,
        batch_s: float | None = None,
    ) -> Task:
        return Task(
            name=name,
            hint=_HINTS[name].value,
            run=run,
            lock=f"{self.lock_prefix}.{name}",
            quick=quick,
            batch_s=batch_s,
        )

    def _lifecycle_run(self, handler: LifecycleHandler) -> Callable[[], Awaitable[TaskRun]]:
        return lambda: self.run_lifecycle(handler)

    def _promotion_run(self, handler: SessionPromotionHandler) -> Callable[[], Awaitable[TaskRun]]:
        return lambda: self.run_promotion(handler)

    async def _record_placed(
        self, conn: AsyncConnection, placed: list[SessionId], owners: Mapping[SessionId, UserId]
    ) -> None:
        """Inside the placement's transaction: the events of the sessions the scheduler placed,
        and PrepareSessions' move of them on to PREPARING.

        The placement locked their agents' slots and found those agents ALIVE and schedulable,
        and their kernels are fresh (no stage failure): PrepareSessions' run would find every
        one of them a success. Made here, its move costs no run of its own, no hint and no
        second commit between a session's placement and its agents' ask (a hop of 3-6 ms of an
        idle submission's start, architecture.md "Moves that continue a commit").
        """
        moves = dict.fromkeys(placed, (SessionStatus.PENDING, SessionStatus.SCHEDULED))
        events = await self._record_moves(conn, moves, {}, ScheduleNewSessions.name(), owners)
        run = _PLACED.get()
        if run is not None:
            run.events.extend(events)
        if not self.continue_stages:
            return
        moved, more = await self._continue_in(conn, self._prepare, placed, SessionStatus.SCHEDULED)
        if run is not None:
            run.events.extend(more)
            run.prepared.update(moved)

    async def _start_prepared(
        self, conn: AsyncConnection, reached: dict[SessionId, SessionStatus]
    ) -> list[Event]:
        """Inside a promotion's transaction: StartSessions' move of the sessions it promoted to
        PREPARED on to CREATING, asking their agents to run them, where StartSessions' run would
        succeed (every live kernel on an ALIVE agent, no failed stage); `reached` is updated.
        The others stay PREPARED for the task, which their move woke, to judge.

        The agents' PREPARED reports and their RUN ask commit together: the ask reaches an agent
        in the answer to its next long-poll, with no run of the task, hint or commit between.
        """
        if not self.continue_stages:
            return []
        prepared = [sid for sid, at in reached.items() if at is SessionStatus.PREPARED]
        if not prepared:
            return []
        blocked = await not_ready_for_stage(conn, self.db.dialect, prepared)
        ready = [sid for sid in prepared if sid not in blocked]
        if not ready:
            return []
        moved, events = await self._continue_in(conn, self._start, ready, SessionStatus.PREPARED)
        reached.update((sid, after) for sid, (_, after) in moved.items())
        return events

    async def _continue_in(
        self,
        conn: AsyncConnection,
        handler: LifecycleHandler,
        session_ids: Sequence[SessionId],
        status: SessionStatus,
    ) -> tuple[dict[SessionId, tuple[SessionStatus, SessionStatus]], list[Event]]:
        """Move sessions that the caller's transaction just brought into `status` on, as
        `handler`'s success moves them, in that transaction: its history, its asks of the
        agents, its events (returned, to publish after the commit) and its count."""
        name = handler.name()
        change = StatusChange(
            session_ids,
            name,
            SchedulingResult.SUCCESS,
            frozenset({status}),
            handler.status_transitions().success,
        )
        applied = await apply_changes_in(conn, self.db.dialect, [change], self.clock())
        moved = applied.moved()
        if self.metrics is not None:
            self.metrics.observe_result(name, SchedulingResult.SUCCESS, len(moved))
        events = await self._record_moves(conn, moved, {}, name, applied.owners)
        return moved, events

    async def _record_moves(
        self,
        conn: AsyncConnection,
        moves: Mapping[SessionId, tuple[SessionStatus, SessionStatus]],
        reasons: Mapping[SessionId, str],
        phase: str,
        owners: Mapping[SessionId, UserId] | None = None,
    ) -> list[Event]:
        full = {sid: reasons.get(sid) or phase for sid in moves}
        return await append_session_moves(
            conn, self.db.dialect, moves, full, self.clock(), owners=owners, notify=self._notify
        )

    async def _next_hints(
        self, moved: Mapping[SessionId, tuple[SessionStatus, SessionStatus]]
    ) -> set[str]:
        """The next phases to wake after the committed `moved`.

        A session entering RUNNING wakes DetectTermination only if a kernel of it has already
        ended (the report's hint came while the session was still CREATING, too early for that
        task): DetectTermination looks at every RUNNING session, so waking it after every start
        would cost a scan of all running sessions per start. The look-up runs after the commit,
        so a kernel ending later sets its own hint and is found by then.
        """
        hints = hints_after_moves(after for _, after in moved.values())
        started = [sid for sid, (_, after) in moved.items() if after is SessionStatus.RUNNING]
        if started and await self.repository.any_kernel_in(
            started, DetectTermination().check_kernel_statuses
        ):
            hints.add(Hint.DETECT_TERMINATION)
        return hints

    async def _post_process(self, hints: set[str], events: Sequence[Event]) -> None:
        if hints:
            await self.hints.set_after_commit(*sorted(str(h) for h in hints))
        await publish_appended(self.events, events)

    async def _needing_attention(
        self, conn: AsyncConnection, handler: LifecycleHandler, group_limits: _GroupLimits
    ) -> list[SessionWithKernels]:
        """The handler's targets; in its watched statuses, only the sessions that need it."""
        return await self.repository.load_needing_attention(
            handler.target_session_statuses,
            handler.watched_session_statuses,
            self._expiring_before(group_limits),
            conn=conn,
        )

    async def _expiring(
        self, conn: AsyncConnection, handler: LifecycleHandler, group_limits: _GroupLimits
    ) -> list[SessionWithKernels]:
        """The handler's targets that entered their status long enough ago to have expired
        (none without a timeout)."""
        entered_before = self._expiring_before(group_limits)
        if entered_before is None:
            return []
        return await self.repository.load(
            handler.target_session_statuses,
            kernel_statuses=handler.target_kernel_statuses,
            entered_before=entered_before,
            conn=conn,
        )

    def _expiring_before(self, group_limits: _GroupLimits) -> datetime | None:
        """Sessions that entered their status before this may have expired: now minus the
        shortest timeout of the default and any group's (None when none sets a timeout)."""
        by_group, default = group_limits
        timeouts = [
            limits.timeout_s
            for limits in (default, *by_group.values())
            if limits.timeout_s is not None
        ]
        return self.clock() - timedelta(seconds=min(timeouts)) if timeouts else None

    async def _group_limits(self, conn: AsyncConnection, phase: str) -> _GroupLimits:
        """Limits per resource group for `phase`, where a group overrides the default; and
        the default."""
        default = self.limits.get(phase, PhaseLimits())
        limits: dict[str, PhaseLimits] = {}
        for group, options in (await group_options(self.db, conn)).items():
            override = ResourceGroupOptions.model_validate(options).phase_limits.get(phase)
            if override is None:
                continue
            limits[group] = PhaseLimits(
                max_attempts=override.max_attempts or default.max_attempts,
                timeout_s=override.timeout_s if override.timeout_s else default.timeout_s,
            )
        return limits, default
