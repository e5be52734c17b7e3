"""Agents' reports of kernel progress, checked against the kernel transition table.

This is the store side of the agent protocol: an agent reports, for kernels placed on it, a
new status (with exit code, failure cause, runtime info), or that its attempt at the current
stage failed and may be retried. A batch is all or nothing: one impossible report (a kernel not
placed on this agent, a move the kernel table forbids) rejects the batch and changes nothing.
Reports are idempotent: a status the kernel already has changes nothing but runtime info.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.results import SchedulingResult
from corral.domain.status import (
    KERNEL_STATUS_BY_VALUE,
    KERNEL_TERMINAL,
    KERNEL_TRANSITIONS,
    KernelStatus,
)
from corral.domain.types import AgentId, KernelId, SessionId
from corral.store._direct import DirectStatement, insert_columns
from corral.store._sql import in_param, payload
from corral.store.agents import apply_slot_deltas
from corral.store.database import Database, Dialect
from corral.store.tables import kernel_history, kernels

PHASE_AGENT = "agent"
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


class KernelReportConflictError(ValueError):
    """A report batch the store refused as a whole; `conflicts` says why, per kernel."""

    def __init__(self, conflicts: Mapping[KernelId, str]) -> None:
        self.conflicts = dict(conflicts)
        detail = "; ".join(f"{kid}: {why}" for kid, why in self.conflicts.items())
        super().__init__(f"{len(self.conflicts)} kernel report(s) refused: {detail}")


@dataclass(slots=True)
class ReportOutcome:
    """What a report batch changed."""

    # kernel → (status before the batch, status after it)
    moved: dict[KernelId, tuple[KernelStatus, KernelStatus]] = field(default_factory=dict)
    # every status some kernel moved into, the intermediate ones of a batch included
    passed: set[KernelStatus] = field(default_factory=set)
    stage_failures: dict[KernelId, KernelStatus] = field(default_factory=dict)
    session_of: dict[KernelId, SessionId] = field(default_factory=dict)  # of the `moved` kernels

    def moved_to(self) -> set[KernelStatus]:
        """Every status kernels moved into (RUNNING of a RUNNING-then-TERMINATED batch too)."""
        return set(self.passed)

    def kernel_moves(self) -> list[tuple[SessionId, KernelStatus, KernelStatus]]:
        """(session, status before, status after) of every kernel the batch moved."""
        return [(self.session_of[kid], *move) for kid, move in self.moved.items()]


async def apply_kernel_reports(
    db: Database, agent_id: AgentId, reports: Sequence[KernelReport], now: datetime
) -> ReportOutcome:
    """Apply an agent's batch of reports in one transaction, or raise and change nothing."""
    (result,) = await apply_report_batches(db, [(agent_id, reports)], now)
    if isinstance(result, KernelReportConflictError):
        raise result
    return result


async def apply_report_batches(
    db: Database,
    batches: Sequence[tuple[AgentId, Sequence[KernelReport]]],
    now: datetime,
) -> list[ReportOutcome | KernelReportConflictError]:
    """Apply several agents' batches in one transaction (group commit), each all or nothing.

    A batch with an impossible report is left out whole and answered with its conflict; the
    others are applied. Batches are judged in order, each against the kernels as the batches
    before it left them. One result per batch, in order.
    """
    results: list[ReportOutcome | KernelReportConflictError] = []
    ids = list(dict.fromkeys(r.kernel_id for _, reports in batches for r in reports))
    if not ids:
        return [ReportOutcome() for _ in batches]
    async with db.transaction() as conn:
        rows = await _LOCK_KERNELS.rows(conn, {"ids": payload(db.dialect, ids)})
        # id, session, agent, status (a KernelStatus), slots held, stage failure
        status_of = KERNEL_STATUS_BY_VALUE
        current: dict[KernelId, tuple[Any, ...]] = {
            KernelId(row[0]): (row[0], row[1], row[2], status_of[row[3]], row[4], row[5])
            for row in rows
        }
        # One update per kernel, folding its reports in order (a later value wins).
        updates: dict[KernelId, dict[str, Any]] = {}
        history: list[tuple[Any, ...]] = []
        releases: dict[AgentId, dict[str, int]] = {}
        for agent_id, reports in batches:
            conflicts = _conflicts(agent_id, reports, current)
            if conflicts:
                results.append(KernelReportConflictError(conflicts))
                continue
            results.append(_fold(agent_id, reports, current, updates, history, releases, now))
        await _write(conn, list(updates.values()))
        await _ADD_HISTORY.run_rows(conn, _HISTORY_COLUMNS, history)
        await apply_slot_deltas(conn, releases)
    return results


def _lock_kernels(dialect: Dialect) -> sa.Select[Any]:
    query = sa.select(
        kernels.c.id,
        kernels.c.session_id,
        kernels.c.agent_id,
        kernels.c.status,
        kernels.c.occupied_slots,
        kernels.c.stage_failure,
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


def _conflicts(
    agent_id: AgentId, reports: Sequence[KernelReport], current: Mapping[KernelId, tuple[Any, ...]]
) -> dict[KernelId, str]:
    conflicts: dict[KernelId, str] = {}
    status_now: dict[KernelId, KernelStatus] = {}
    for report in reports:
        why = _refusal(agent_id, report, current.get(report.kernel_id), status_now)
        if why is not None:
            conflicts[report.kernel_id] = why
        elif not report.stage_failed:
            status_now[report.kernel_id] = report.status
    return conflicts


def _fold(
    agent_id: AgentId,
    reports: Sequence[KernelReport],
    current: dict[KernelId, tuple[Any, ...]],
    updates: dict[KernelId, dict[str, Any]],
    history: list[tuple[Any, ...]],
    releases: dict[AgentId, dict[str, int]],
    now: datetime,
) -> ReportOutcome:
    """Fold one accepted batch into the pending writes; what it changes."""
    outcome = ReportOutcome()
    for report in reports:
        row = current[report.kernel_id]
        before: KernelStatus = row[3]
        values = _report_values(report, before, now)
        if values is None:
            continue
        updates.setdefault(report.kernel_id, {"kid": report.kernel_id}).update(values)
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
        current[report.kernel_id] = (*row[:3], report.status, held_after, None)
    return outcome


def _refusal(
    agent_id: AgentId,
    report: KernelReport,
    row: Any,
    status_now: Mapping[KernelId, KernelStatus],
) -> str | None:
    if row is None:
        return "no such kernel"
    if row[2] != agent_id:
        return f"not placed on agent {agent_id}"
    before = status_now.get(report.kernel_id, row[3])
    if report.stage_failed:
        if report.status is not before or before not in RETRYABLE_STAGES:
            return (
                f"a failed stage must name the kernel's current status {before.value}, "
                f"one of {', '.join(sorted(s.value for s in RETRYABLE_STAGES))}"
            )
        return None
    if report.status is not before and not KERNEL_TRANSITIONS.allowed(before, report.status):
        return f"cannot move from {before.value} to {report.status.value}"
    return None


def _report_values(
    report: KernelReport, before: KernelStatus, now: datetime
) -> dict[str, Any] | None:
    """The column values a report writes (None: nothing to write)."""
    values: dict[str, Any] = {}
    if report.runtime_info is not None:
        values["runtime_info"] = dict(report.runtime_info)
    if report.stage_failed:
        values["stage_failure"] = report.failure_cause or "stage_failed"
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
