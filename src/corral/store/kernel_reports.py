"""Agents' reports of kernel progress, checked against the kernel transition table.

This is the store side of the agent protocol: an agent reports, for kernels placed on it, a
new status (with exit code, failure cause, runtime info), or that its attempt at the current
stage failed and may be retried. Reports are idempotent and monotone, judged one at a time
against the kernel as the reports before it left it (`ReportVerdict`): a move the kernel table
allows is applied; a status the kernel already has or has passed (a batch re-sent after its
answer was lost), or a report of an earlier placement (`attempt`), is acknowledged as already
applied; only an impossible report (TERMINATED → RUNNING, another agent's kernel) is refused,
alone. The batch's other reports, that kernel's later ones included, are applied all the same.

A RUNNING kernel's restarts (the restart policy, `domain.restarts`) are reports too, ordered by
`restart_position`: one the kernel has passed is acknowledged, so a batch re-sent after a lost
answer counts no restart twice. The agent decided the restart; the manager records it, and in
the same transaction turns the session's KernelsReady condition false (`WaitForRecovery`) when
a kernel went down, and true again (`Recovered`) once none of its kernels is restarting.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.admission import KernelsReadyReason
from corral.domain.events import (
    SESSION_ENTITY,
    SESSION_KERNEL_RESTARTING,
    SESSION_RECOVERED,
    Event,
)
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.restarts import restart_position
from corral.domain.results import ResultNote, SchedulingResult
from corral.domain.status import (
    KERNEL_STATUS_BY_VALUE,
    KERNEL_TERMINAL,
    KERNEL_TRANSITIONS,
    KernelStatus,
    SessionStatus,
    kernel_passed,
)
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store._direct import DirectStatement, insert_columns
from corral.store._sql import in_param, payload
from corral.store.agents import apply_slot_deltas
from corral.store.database import Database, Dialect
from corral.store.events import append_events
from corral.store.history import record_session_history
from corral.store.tables import kernel_history, kernels, sessions

PHASE_AGENT = "agent"
# The phase of the history rows of a kernel's restarts (kernel and session history).
PHASE_RESTART = "KernelRestart"
# Stages an agent may fail and the manager retry (PrepareSessions, StartSessions).
RETRYABLE_STAGES = frozenset(
    {KernelStatus.PREPARING, KernelStatus.PULLING, KernelStatus.PREPARED, KernelStatus.CREATING}
)


@record
class KernelReport:
    """One kernel's progress as its agent saw it."""

    kernel_id: KernelId
    status: KernelStatus
    exit_code: int | None = None
    failure_cause: str | None = None
    message: str | None = None
    runtime_info: Mapping[str, Any] | None = None
    # The attempt at the current stage failed (status unchanged); the manager may ask again.
    stage_failed: bool = False
    # The placement the report is about (`kernels.attempt`, from the agent's assignment);
    # None: the current one.
    attempt: int | None = None
    # Set (with status RUNNING): the kernel's `restarts`-th restart is under way, `restarting`
    # (its process exited, it is being started again) or done (it runs again).
    restarts: int | None = None
    restarting: bool = False

    @property
    def restart_position(self) -> int | None:
        """Where the report stands among the kernel's restarts (None: not about one)."""
        if self.restarts is None:
            return None
        return restart_position(self.restarts, self.restarting)


@dataclass(slots=True)
class ReportOutcome:
    """What a report batch changed, and what it did not."""

    # kernel → (status before the batch, status after it)
    moved: dict[KernelId, tuple[KernelStatus, KernelStatus]] = field(default_factory=dict)
    # every status some kernel moved into, the intermediate ones of a batch included
    passed: set[KernelStatus] = field(default_factory=set)
    stage_failures: dict[KernelId, KernelStatus] = field(default_factory=dict)
    session_of: dict[KernelId, SessionId] = field(default_factory=dict)  # of the `moved` kernels
    already: int = 0  # reports acknowledged as applied before (repeats, passed, superseded)
    refused: dict[KernelId, str] = field(default_factory=dict)  # impossible reports, why
    # kernel → (its session, restarting after the batch): the kernels whose restarts the batch
    # moved on; `went_down`: those of them it reported down at some point (up again or not)
    restarted: dict[KernelId, tuple[SessionId, bool]] = field(default_factory=dict)
    went_down: set[KernelId] = field(default_factory=set)

    def moved_to(self) -> set[KernelStatus]:
        """Every status kernels moved into (RUNNING of a RUNNING-then-TERMINATED batch too)."""
        return set(self.passed)

    def kernel_moves(self) -> list[tuple[SessionId, KernelStatus, KernelStatus]]:
        """(session, status before, status after) of every kernel the batch moved."""
        return [(self.session_of[kid], *move) for kid, move in self.moved.items()]


class ReportVerdict(Enum):
    """How one report is judged against its kernel (a refusal is its reason, a string)."""

    APPLY = "apply"  # a move the kernel table allows (or a failed stage to record)
    ALREADY = "already"  # nothing to move: a repeat, a status passed, an earlier placement


async def apply_kernel_reports(
    db: Database, agent_id: AgentId, reports: Sequence[KernelReport], now: datetime
) -> ReportOutcome:
    """Apply an agent's batch of reports in one transaction, as far as each is legal."""
    (result,) = await apply_report_batches(db, [(agent_id, reports)], now)
    return result


async def apply_report_batches(
    db: Database,
    batches: Sequence[tuple[AgentId, Sequence[KernelReport]]],
    now: datetime,
) -> list[ReportOutcome]:
    """Apply several agents' batches in one transaction (group commit).

    Reports are judged in order, each against its kernel as the reports before it (of its
    batch and the batches before) left it; an impossible one is refused alone and named in
    its batch's outcome. One outcome per batch, in order.
    """
    results: list[ReportOutcome] = []
    ids = list(dict.fromkeys(r.kernel_id for _, reports in batches for r in reports))
    if not ids:
        return [ReportOutcome() for _ in batches]
    async with db.transaction() as conn:
        rows = await _LOCK_KERNELS.rows(conn, {"ids": payload(db.dialect, ids)})
        # id, session, agent, status (a KernelStatus), slots held, stage failure, attempt,
        # the manager's open question about the kernel (`store.kernel_checks`), restarts,
        # restarting
        status_of = KERNEL_STATUS_BY_VALUE
        current: dict[KernelId, tuple[Any, ...]] = {
            KernelId(row[0]): (row[0], row[1], row[2], status_of[row[3]], *row[4:10])
            for row in rows
        }
        # One update per kernel, folding its reports in order (a later value wins).
        updates: dict[KernelId, dict[str, Any]] = {}
        history: list[tuple[Any, ...]] = []
        releases: dict[AgentId, dict[str, int]] = {}
        for agent_id, reports in batches:
            results.append(_fold(agent_id, reports, current, updates, history, releases, now))
        await _write(conn, list(updates.values()))
        await _ADD_HISTORY.run_rows(conn, _HISTORY_COLUMNS, history)
        await apply_slot_deltas(conn, releases)
        if any(outcome.restarted for outcome in results):
            await _recovery_conditions(conn, db.dialect, results, now)
    return results


def _lock_kernels(dialect: Dialect) -> sa.Select[Any]:
    query = sa.select(
        kernels.c.id,
        kernels.c.session_id,
        kernels.c.agent_id,
        kernels.c.status,
        kernels.c.occupied_slots,
        kernels.c.stage_failure,
        kernels.c.attempt,
        kernels.c.asked_at,
        kernels.c.restarts,
        kernels.c.restarting,
    ).where(in_param(dialect, kernels.c.id, "ids"))
    if dialect == "postgresql":
        query = query.order_by(kernels.c.id).with_for_update()
    return query


_LOCK_KERNELS = DirectStatement(_lock_kernels)
_HISTORY_COLUMNS = (
    "kernel_id",
    "session_id",
    "phase",
    "from_status",
    "to_status",
    "result",
    "error_code",
    "message",
    "attempts",
    "created_at",
    "updated_at",
)
# The values of `_history_row`, in this order.
_ADD_HISTORY = insert_columns(kernel_history, _HISTORY_COLUMNS)
_SUCCESS = SchedulingResult.SUCCESS.value
_APPLY, _ALREADY = ReportVerdict.APPLY, ReportVerdict.ALREADY


def _fold(
    agent_id: AgentId,
    reports: Sequence[KernelReport],
    current: dict[KernelId, tuple[Any, ...]],
    updates: dict[KernelId, dict[str, Any]],
    history: list[tuple[Any, ...]],
    releases: dict[AgentId, dict[str, int]],
    now: datetime,
) -> ReportOutcome:
    """Judge one batch report by report and fold what applies into the pending writes."""
    outcome = ReportOutcome()
    for index, report in enumerate(reports):
        row = current.get(report.kernel_id)
        verdict = judge_report(agent_id, report, row, reports, index)
        if verdict is _ALREADY:
            outcome.already += 1
            if row is not None and _about_current(agent_id, report, row):
                update = None
                if report.runtime_info is not None and report.status is row[3]:
                    update = updates.setdefault(report.kernel_id, {"kid": report.kernel_id})
                    update["runtime_info"] = dict(report.runtime_info)
                if row[7] is not None:  # the answer to the manager's question
                    update = update or updates.setdefault(
                        report.kernel_id, {"kid": report.kernel_id}
                    )
                    update.update(heard_at=now, asked_at=None)
                    current[report.kernel_id] = (*row[:7], None, *row[8:])
            continue
        if isinstance(verdict, str):
            outcome.refused[report.kernel_id] = verdict
            continue
        assert row is not None  # only a known kernel is applied
        before: KernelStatus = row[3]
        values = _report_values(report, before, now)
        if row[7] is not None:  # any report of the kernel answers the manager's question
            values = {**(values or {}), "heard_at": now, "asked_at": None}
        restart = _restart_moved(report, row)
        if restart:
            values = {
                **(values or {}),
                "restarts": report.restarts,
                "restarting": report.restarting,
                "status_info": (report.message or "")[:512],
            }
            outcome.restarted[report.kernel_id] = (SessionId(row[1]), report.restarting)
            if report.restarting:
                outcome.went_down.add(report.kernel_id)
            history.append(_restart_history_row(report, row[1], now))
        elif row[9] and report.status is not before:
            # A kernel that moves on (stopped while restarting, or placed again) is not
            # restarting any more.
            values = {**(values or {}), "restarting": False}
        if values is not None:
            updates.setdefault(report.kernel_id, {"kid": report.kernel_id}).update(values)
        if restart and report.status is before:  # a restart alone: no status moved
            current[report.kernel_id] = (*row[:7], None, report.restarts, report.restarting)
            continue
        if report.stage_failed:
            outcome.stage_failures[report.kernel_id] = before
            continue
        first = outcome.moved.get(report.kernel_id, (before, before))[0]
        outcome.moved[report.kernel_id] = (first, report.status)
        outcome.session_of[report.kernel_id] = SessionId(row[1])
        outcome.passed.add(report.status)
        history.append(_history_row(report, row[1], before, now))
        if report.status in KERNEL_TERMINAL and row[4]:
            held = releases.setdefault(agent_id, {})
            for slot, amount in row[4].items():
                held[slot] = held.get(slot, 0) - int(amount)
        # A later report (of this batch or the next) starts where this one left the kernel.
        held_after = None if report.status in KERNEL_TERMINAL else row[4]
        restarts = (report.restarts, report.restarting) if restart else (row[8], False)
        current[report.kernel_id] = (
            *row[:3],
            report.status,
            held_after,
            None,
            row[6],
            None,
            *restarts,
        )
    return outcome


def judge_report(
    agent_id: AgentId,
    report: KernelReport,
    row: Sequence[Any] | None,
    batch: Sequence[KernelReport],
    index: int,
) -> ReportVerdict | str:
    """How `batch[index]` stands against its kernel's row (id, session, agent, status, slots,
    stage failure, attempt): apply it, acknowledge it as already applied, or refuse it (why)."""
    if row is None:
        return "no such kernel"
    placed_on, before, attempt = row[2], row[3], row[6]
    if report.attempt is not None and report.attempt < attempt:
        return _ALREADY  # an earlier placement's report: the kernel has moved on
    if placed_on != agent_id:
        if placed_on is None and before is KernelStatus.PENDING and attempt > 0:
            return _ALREADY  # taken back from its agent: that placement is over
        return f"not placed on agent {agent_id}"
    if report.attempt is not None and report.attempt > attempt:
        return f"no placement {report.attempt} yet (the kernel's is {attempt})"
    if report.stage_failed:
        if report.status is before and before in RETRYABLE_STAGES:
            return _APPLY
        if kernel_passed(report.status, before):
            return _ALREADY  # the stage has been passed since
        return (
            f"a failed stage must name the kernel's current status {before.value}, "
            f"one of {', '.join(sorted(s.value for s in RETRYABLE_STAGES))}"
        )
    if report.status is before:
        if _restart_moved(report, row):
            return _APPLY
        return _ALREADY
    if KERNEL_TRANSITIONS.allowed(before, report.status):
        return _APPLY
    if kernel_passed(report.status, before):
        return _ALREADY
    if before in KERNEL_TERMINAL and _ends_as(batch, index, report.kernel_id, before):
        return _ALREADY  # a re-sent batch that ends where the kernel ended
    return f"cannot move from {before.value} to {report.status.value}"


def _restart_moved(report: KernelReport, row: Sequence[Any]) -> bool:
    """Whether `report` moves a RUNNING kernel's restarts on (not one it has passed)."""
    position = report.restart_position
    if position is None or report.status is not KernelStatus.RUNNING:
        return False
    return position > restart_position(row[8], row[9])


def _about_current(agent_id: AgentId, report: KernelReport, row: Sequence[Any]) -> bool:
    """Whether the report is about the kernel's current placement, on this agent."""
    return row[2] == agent_id and (report.attempt is None or report.attempt == row[6])


def _ends_as(
    batch: Sequence[KernelReport], index: int, kernel_id: KernelId, status: KernelStatus
) -> bool:
    """Whether a later report of the kernel in the batch names `status`."""
    return any(
        r.kernel_id == kernel_id and r.status is status and not r.stage_failed
        for r in batch[index + 1 :]
    )


def _report_values(
    report: KernelReport, before: KernelStatus, now: datetime
) -> dict[str, Any] | None:
    """The column values a report writes (None: nothing to write)."""
    values: dict[str, Any] = {}
    if report.runtime_info is not None:
        values["runtime_info"] = dict(report.runtime_info)
    if report.stage_failed:
        values["stage_failure"] = report.failure_cause or FailureCause.STAGE_FAILED
        values["status_info"] = (report.message or "")[:512]
    elif report.status is not before:
        values["status"] = report.status.value
        values["status_changed_at"] = now
        values["stage_failure"] = None
        if report.exit_code is not None:
            values["exit_code"] = report.exit_code
        if report.failure_cause is not None:
            values["failure_cause"] = report.failure_cause
        if report.message is not None:
            values["status_info"] = report.message[:512]
        if report.status in KERNEL_TERMINAL:
            values["occupied_slots"] = None
    return values or None


async def _write(conn: AsyncConnection, updates: list[dict[str, Any]]) -> None:
    """One executemany per set of columns written; at most one update per kernel, so the
    grouping cannot reorder two writes of the same row."""
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for update in updates:
        columns = tuple(sorted(c for c in update if c != "kid"))
        # Bound names must differ from column names (SQLAlchemy reserves those for VALUES).
        by_columns.setdefault(columns, []).append({f"v_{k}": v for k, v in update.items()})
    for columns, params in by_columns.items():
        await _update_statement(columns).run_many(conn, params)


@functools.cache
def _update_statement(columns: tuple[str, ...]) -> DirectStatement:
    """The update of these columns (a few sets of them: what the kinds of report write)."""
    return DirectStatement(
        lambda _dialect: (
            kernels.update()
            .where(kernels.c.id == sa.bindparam("v_kid", type_=kernels.c.id.type))
            .values({c: sa.bindparam(f"v_{c}", type_=kernels.c[c].type) for c in columns})
        )
    )


def _restart_history_row(report: KernelReport, session_id: Any, now: datetime) -> tuple[Any, ...]:
    """A kernel history row of a restart (RUNNING → RUNNING), in `_HISTORY_COLUMNS` order."""
    running = KernelStatus.RUNNING.value
    what = "restarting" if report.restarting else "running again"
    message = f"restart {report.restarts}: {what}" + (
        f" ({report.message})" if report.message else ""
    )
    return (
        report.kernel_id,
        session_id,
        PHASE_RESTART,
        running,
        running,
        _SUCCESS,
        report.failure_cause,
        message[:1024],
        1,
        now,
        now,
    )


async def _recovery_conditions(
    conn: AsyncConnection, dialect: Dialect, outcomes: Sequence[ReportOutcome], now: datetime
) -> None:
    """The KernelsReady condition of the sessions whose kernels went down or came back up:
    false (`WaitForRecovery`, from now) when a kernel of a RUNNING ready session went down; true
    (`Recovered`) once none of its kernels is restarting. Sessions where the condition is not
    tracked (NULL) or that are not RUNNING keep theirs. History and events record each change."""
    down: dict[SessionId, list[KernelId]] = {}
    up: dict[SessionId, list[KernelId]] = {}
    for outcome in outcomes:
        for kernel_id, (session_id, restarting) in outcome.restarted.items():
            if kernel_id in outcome.went_down:
                down.setdefault(session_id, []).append(kernel_id)
            if not restarting:
                up.setdefault(session_id, []).append(kernel_id)
    changed: list[tuple[SessionId, str, KernelsReadyReason, list[KernelId]]] = []
    for session_id, kernel_ids in down.items():
        moved = await conn.execute(_NOT_READY, {"sid": session_id, "now": now})
        if moved.rowcount:
            changed.append(
                (
                    session_id,
                    SESSION_KERNEL_RESTARTING,
                    KernelsReadyReason.WAIT_FOR_RECOVERY,
                    kernel_ids,
                )
            )
    for session_id, kernel_ids in up.items():
        moved = await conn.execute(_RECOVERED, {"sid": session_id, "now": now})
        if moved.rowcount:
            changed.append(
                (session_id, SESSION_RECOVERED, KernelsReadyReason.RECOVERED, kernel_ids)
            )
    if not changed:
        return
    owners = dict(
        (
            await conn.execute(
                sa.select(sessions.c.id, sessions.c.owner_id).where(
                    in_param(dialect, sessions.c.id, "ids")
                ),
                {"ids": payload(dialect, list({c[0] for c in changed}))},
            )
        ).all()
    )
    for session_id, _kind, reason, _kernels in changed:
        ready = reason is KernelsReadyReason.RECOVERED
        what = "every kernel runs again" if ready else "a kernel is being restarted"
        await record_session_history(
            conn,
            dialect,
            [session_id],
            phase=PHASE_RESTART,
            # Down: the kernel's run failed and is being tried again; up: it runs again.
            result=_SUCCESS if ready else SchedulingResult.NEED_RETRY.value,
            to_status=None,
            now=now,
            moving=False,
            notes={
                session_id: ResultNote(reason.value, f"KernelsReady {str(ready).lower()}: {what}")
            },
        )
    await append_events(
        conn,
        [
            Event(
                kind=kind,
                entity_type=SESSION_ENTITY,
                entity_id=str(session_id),
                owner_id=owners.get(session_id),
                payload={
                    "kernels_ready": reason is KernelsReadyReason.RECOVERED,
                    "reason": reason.value,
                    "kernels": sorted(str(k) for k in kernel_ids),
                },
                created_at=now,
            )
            for session_id, kind, reason, kernel_ids in changed
        ],
        now,
    )


_NOT_READY = (
    sessions.update()
    .where(
        sessions.c.id == sa.bindparam("sid", type_=sessions.c.id.type),
        sessions.c.status == SessionStatus.RUNNING.value,
        sessions.c.kernels_ready.is_(True),
    )
    .values(
        kernels_ready=False,
        kernels_ready_reason=KernelsReadyReason.WAIT_FOR_RECOVERY.value,
        kernels_ready_at=sa.bindparam("now", type_=sessions.c.kernels_ready_at.type),
    )
)
_RECOVERED = (
    sessions.update()
    .where(
        sessions.c.id == sa.bindparam("sid", type_=sessions.c.id.type),
        sessions.c.status == SessionStatus.RUNNING.value,
        sessions.c.kernels_ready.is_(False),
        sessions.c.kernels_ready_reason == KernelsReadyReason.WAIT_FOR_RECOVERY.value,
        # Only a RUNNING kernel is restarting: one moved on by other means (stopped, lost)
        # may keep the flag until its next report.
        ~sa.exists().where(
            kernels.c.session_id == sessions.c.id,
            kernels.c.restarting.is_(True),
            kernels.c.status == KernelStatus.RUNNING.value,
        ),
    )
    .values(
        kernels_ready=True,
        kernels_ready_reason=KernelsReadyReason.RECOVERED.value,
        kernels_ready_at=sa.bindparam("now", type_=sessions.c.kernels_ready_at.type),
    )
)


def _history_row(
    report: KernelReport, session_id: Any, before: KernelStatus, now: datetime
) -> tuple[Any, ...]:
    """A kernel history row of a report's move, in `_HISTORY_COLUMNS` order."""
    return (
        report.kernel_id,
        session_id,
        PHASE_AGENT,
        before.value,
        report.status.value,
        _SUCCESS,
        report.failure_cause,
        report.message or "",
        1,
        now,
        now,
    )
