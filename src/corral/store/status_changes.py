"""Guarded status changes of sessions and their kernels, with history and slot release.

One `apply_changes` call is one transaction. Every change is checked against the domain's
transition table before anything is written, touches only sessions still in the expected
status (the guard; the rest are reported stale), moves their kernels along the kernel table,
gives back the slots of kernels that go back to PENDING or end, and writes the history.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.admission import KernelsReadyReason
from corral.domain.failure_causes import FailureCause
from corral.domain.outcome import REQUESTED_RESULTS, SessionResult
from corral.domain.record import record
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.session import KernelIntent
from corral.domain.status import (
    KERNEL_TERMINAL,
    KERNEL_TRANSITIONS,
    SESSION_TERMINAL,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)
from corral.domain.types import AgentId, SessionId, UserId
from corral.store._direct import DirectStatement
from corral.store._sql import (
    IdBatch,
    id_batch,
    in_constants,
    in_param,
    in_values,
    payload,
    slot_entries,
)
from corral.store.agent_kernels import forgetting
from corral.store.agents import apply_slot_deltas
from corral.store.assignments import bump_revisions
from corral.store.database import Database, Dialect
from corral.store.history import by_note, record_kernel_history, record_session_history
from corral.store.tables import kernels, sessions

# Results after which the agents that held the session count as having failed it.
_FAILED_RESULTS = frozenset({SchedulingResult.EXPIRED, SchedulingResult.GIVE_UP})


@record
class StatusChange:
    """One judged outcome for a batch of sessions: a guarded move plus its history.

    Only sessions whose current status is in `expected` are touched (the guard); the rest were
    moved by someone else and are reported back as stale. With `target` None (or both of its
    fields None) only history is written. `count_attempt` adds one to the sessions' attempts in
    `phase` (failed attempts that keep their status). A note's code becomes the session's
    failure cause when the move ends it, or with `records_cause` on any move: an end asked for
    (a user's terminate, a time limit) is recorded as the session starts to stop, and decides
    its result once its kernels have stopped (`outcome.REQUESTED_RESULTS`).
    """

    session_ids: Sequence[SessionId]
    phase: str
    result: SchedulingResult
    expected: frozenset[SessionStatus]
    target: TransitionStatus | None = None
    notes: Mapping[SessionId, ResultNote] = field(default_factory=dict)
    count_attempt: bool = False
    records_cause: bool = False

    def validate(self) -> None:
        """Raise IllegalTransitionError if the declared move breaks the session table."""
        if self.target is not None and self.target.session is not None:
            SESSION_TRANSITIONS.check(self.expected - {self.target.session}, self.target.session)


@dataclass(slots=True)
class AppliedChanges:
    """What an `apply` actually did."""

    # session id → (status before, status after), for every session that passed its guard
    sessions: dict[SessionId, tuple[SessionStatus, SessionStatus]] = field(default_factory=dict)
    # how many kernels changed status
    kernels_moved: int = 0
    # sessions named in a change whose guard failed (moved concurrently)
    stale: set[SessionId] = field(default_factory=set)
    # the owner of every session in `sessions` (for the events that describe the moves)
    owners: dict[SessionId, UserId] = field(default_factory=dict)

    def moved(self) -> dict[SessionId, tuple[SessionStatus, SessionStatus]]:
        """Only the sessions whose status changed."""
        return {sid: move for sid, move in self.sessions.items() if move[0] != move[1]}


async def apply_changes(
    db: Database,
    changes: Sequence[StatusChange],
    now: datetime,
    *,
    on_applied: Callable[[AsyncConnection, AppliedChanges], Awaitable[None]] | None = None,
) -> AppliedChanges:
    """Apply judged changes in one transaction: guarded moves, slot release, history.

    `on_applied` runs last inside the same transaction, with what was applied: the place to
    append the events that describe the change, so the change and its audit log commit together.
    With no session named at all, nothing is opened (and `on_applied` does not run).
    """
    for change in changes:
        change.validate()
    applied = AppliedChanges()
    if not any(change.session_ids for change in changes):
        return applied
    async with db.transaction() as conn:
        for change in changes:
            await _apply_one(conn, db.dialect, change, now, applied)
        if on_applied is not None:
            await on_applied(conn, applied)
    return applied


async def apply_changes_in(
    conn: AsyncConnection, dialect: Dialect, changes: Sequence[StatusChange], now: datetime
) -> AppliedChanges:
    """`apply_changes` inside the caller's transaction: moves that continue the ones it just
    wrote (the sessions a placement scheduled, asked to prepare in the same commit)."""
    for change in changes:
        change.validate()
    applied = AppliedChanges()
    for change in changes:
        await _apply_one(conn, dialect, change, now, applied)
    return applied


@record
class ChainedMoves:
    """Sessions moved several times in a row, each move by its own phase: a promotion chain
    (CREATING → RUNNING → TERMINATING → TERMINATED when a kernel ran and ended at once).

    Guarded like a StatusChange, by `expected` for the first move only: each later move starts
    where the one before left the sessions. Every move gets its history row, and the session
    rows are written once, with where the chain ends. `notes` belong to the last move (an
    ending's cause); `endings` are the (result, exit code) of sessions the chain ends.
    """

    session_ids: Sequence[SessionId]
    expected: frozenset[SessionStatus]
    moves: Sequence[tuple[str, SessionStatus]]  # (phase, status moved to), in order
    notes: Mapping[SessionId, ResultNote] = field(default_factory=dict)
    endings: Mapping[SessionId, tuple[str, int | None]] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise IllegalTransitionError if a move breaks the session table (a move that would
        leave a session where it is counts as one); ValueError if there is no move."""
        if not self.moves:
            raise ValueError("a chain of moves needs at least one move")
        sources = self.expected
        for _, to in self.moves:
            SESSION_TRANSITIONS.check(sources, to)
            sources = frozenset({to})


async def apply_chains(
    db: Database,
    chains: Sequence[ChainedMoves],
    now: datetime,
    *,
    on_step: Callable[[AsyncConnection, AppliedChanges], Awaitable[None]] | None = None,
) -> list[AppliedChanges]:
    """Apply chains of moves in one transaction; what each round applied, in order (round i:
    the i-th move of every chain that has one).

    One lock for every session, one history insert per move, one update per way a chain ends:
    a chain of three moves writes its session rows once instead of three times (and locks them
    once). A session belongs to one chain. `on_step` runs for each round, in order, after
    everything is written.
    """
    for chain in chains:
        chain.validate()
    results = [AppliedChanges() for _ in range(max((len(c.moves) for c in chains), default=0))]
    named = id_batch(db.dialect, dict.fromkeys(sid for c in chains for sid in c.session_ids))
    if not named:
        return results
    owners = results[0].owners
    for applied in results[1:]:
        applied.owners = owners
    guards = frozenset().union(*(c.expected for c in chains))
    async with db.transaction() as conn:
        current = await lock_sessions(conn, db.dialect, named, guards, owners=owners)
        passing: list[tuple[ChainedMoves, list[SessionId]]] = []
        for chain in chains:
            passed = [sid for sid in chain.session_ids if current.get(sid) in chain.expected]
            if len(passed) < len(chain.session_ids):
                results[0].stale.update(set(chain.session_ids).difference(passed))
            if not passed:
                continue
            passing.append((chain, passed))
            before = {sid: current[sid] for sid in passed}
            for applied, (_, to) in zip(results, chain.moves, strict=False):
                applied.sessions.update((sid, (before[sid], to)) for sid in passed)
                before = dict.fromkeys(passed, to)
        await _write_chains(conn, db.dialect, passing, now)
        if on_step is not None:
            for applied in results:
                await on_step(conn, applied)
    return results


async def _write_chains(
    conn: AsyncConnection,
    dialect: Dialect,
    chains: Sequence[tuple[ChainedMoves, Sequence[SessionId]]],
    now: datetime,
) -> None:
    """The history of every move, then the session rows, once per way of ending.

    Chains that make the same move at the same step (a run that ended in success and one that
    failed both went RUNNING, then TERMINATING) share its history statement, and chains that
    end alike share their row update: a batch with failures in it has a chain per kind of
    ending, and so wrote its common moves once per chain. The first move reads the status left
    from the rows, still unwritten; each later one leaves where the one before went.
    """
    for depth in range(max((len(chain.moves) for chain, _ in chains), default=0)):
        # (phase, status moved to, status left) -> the sessions making that move, their notes
        moves: dict[tuple[str, SessionStatus, SessionStatus | None], list[SessionId]] = {}
        notes: dict[SessionId, ResultNote] = {}
        for chain, passed in chains:
            if depth >= len(chain.moves):
                continue
            phase, to = chain.moves[depth]
            left = chain.moves[depth - 1][1] if depth else None
            moves.setdefault((phase, to, left), []).extend(passed)
            if depth == len(chain.moves) - 1:  # a chain's notes belong to its last move
                notes.update((sid, chain.notes[sid]) for sid in passed if sid in chain.notes)
        for (phase, to, left), sids in moves.items():
            await record_session_history(
                conn,
                dialect,
                id_batch(dialect, sids),
                phase=phase,
                result=SchedulingResult.SUCCESS.value,
                to_status=to.value,
                now=now,
                moving=True,
                notes=notes or None,
                left=left.value if left is not None else None,
            )
    # (status the chain ends in, whether it passed RUNNING, its ending) -> sessions
    rows: dict[tuple[SessionStatus, bool, tuple[str, int | None] | None], list[SessionId]] = {}
    ended_notes: dict[SessionId, ResultNote] = {}
    kept_notes: dict[SessionId, ResultNote] = {}
    for chain, passed in chains:
        final = chain.moves[-1][1]
        started = any(to is SessionStatus.RUNNING for _, to in chain.moves)
        for sid in passed:
            rows.setdefault((final, started, chain.endings.get(sid)), []).append(sid)
            if sid in chain.notes:
                noted = ended_notes if final in SESSION_TERMINAL else kept_notes
                noted[sid] = chain.notes[sid]
    for (final, started, ending), sids in rows.items():
        result, code = ending if ending is not None else (None, None)
        await _session_move(final, started=started, ending=ending is not None).run(
            conn,
            {"ids": payload(dialect, sids), "now": now, "result": result, "code": code},
        )
    for noted, ends in ((ended_notes, True), (kept_notes, False)):
        await _write_notes(conn, dialect, noted, list(noted), ends=ends)


async def lock_sessions(
    conn: AsyncConnection,
    dialect: Dialect,
    ids: Collection[SessionId] | IdBatch,
    statuses: Collection[SessionStatus],
    *,
    owners: dict[SessionId, UserId] | None = None,
) -> dict[SessionId, SessionStatus]:
    """The sessions among `ids` whose status is one of `statuses`, locked for this transaction.

    PostgreSQL locks them (FOR UPDATE, in id order, so concurrent writers cannot deadlock).
    SQLite writers are serialised by BEGIN IMMEDIATE; there the status is checked here rather
    than in SQL, because without statistics SQLite would pick the status index and scan every
    session in that status to find a small batch. SQLite's ids come back as the stored hex
    text and are matched to the caller's ids rather than parsed (10,000 UUIDs parsed cost more
    than the query). With `owners`, the owner of every session returned is added to it.
    """
    allowed = {s.value: s for s in statuses}
    batch = ids if isinstance(ids, IdBatch) else id_batch(dialect, ids)
    with_owners = owners is not None
    if dialect == "postgresql":
        query = _lock_query(with_owners, tuple(sorted(allowed)))
        rows = await query.rows(conn, {"ids": batch.payload})
        if owners is not None:
            owners.update((SessionId(sid), UserId(owner)) for sid, _, owner in rows)
        return {SessionId(sid): allowed[status] for sid, status, _ in rows}
    by_hex = dict(zip(json.loads(batch.payload), batch.values, strict=True))
    found = await _lock_query(with_owners, ()).rows(conn, {"ids": batch.payload})
    current: dict[SessionId, SessionStatus] = {}
    parsed: dict[str, UserId] = {}  # few owners, many sessions: parse each owner id once
    for hex_id, status, owner in found:
        if status in allowed:
            sid = by_hex[hex_id]
            current[sid] = allowed[status]
            if owners is not None:
                owners[sid] = parsed.get(owner) or parsed.setdefault(
                    owner, UserId(uuid.UUID(owner))
                )
    return current


@functools.cache
def _lock_query(with_owners: bool, statuses: tuple[str, ...]) -> DirectStatement:
    """`lock_sessions`' statement (parameter: ids); `statuses` are checked in SQL on PostgreSQL."""

    def build(dialect: Dialect) -> sa.Select[Any]:
        owner = sessions.c.owner_id if with_owners else sa.null()
        if dialect == "postgresql":
            return (
                sa.select(sessions.c.id, sessions.c.status, owner)
                .where(
                    in_param(dialect, sessions.c.id, "ids"),
                    in_constants(sessions.c.status, statuses),
                )
                .order_by(sessions.c.id)
                .with_for_update()
            )
        # Ids and owners as their stored hex text (see `lock_sessions`).
        return sa.select(
            sa.type_coerce(sessions.c.id, sa.String()),
            sessions.c.status,
            sa.type_coerce(owner, sa.String()) if with_owners else owner,
        ).where(in_param(dialect, sessions.c.id, "ids"))

    return DirectStatement(build)


async def _apply_one(
    conn: AsyncConnection,
    dialect: Dialect,
    change: StatusChange,
    now: datetime,
    applied: AppliedChanges,
) -> None:
    # Encoded once and shared by every statement below; the batch also drops repeated ids.
    named = id_batch(dialect, dict.fromkeys(change.session_ids))
    if not named:
        return
    current = await lock_sessions(conn, dialect, named, change.expected, owners=applied.owners)
    if len(current) < len(named):
        applied.stale.update(sid for sid in named if sid not in current)
    if not current:
        return

    target = change.target or TransitionStatus()
    to = target.session
    if to is SessionStatus.PENDING:
        current = await _end_stranded(conn, dialect, change, current, now, applied)
        if not current:
            return
    passed = named if len(current) == len(named) else id_batch(dialect, current)
    if to is None:
        moving, staying = id_batch(dialect, ()), passed
    elif to not in current.values():
        moving, staying = passed, id_batch(dialect, ())
    else:
        moving = id_batch(dialect, [sid for sid, status in current.items() if status != to])
        staying = id_batch(dialect, [sid for sid, status in current.items() if status == to])
    to_status = to.value if to is not None else None
    # History first: it reads the statuses being left straight from the rows.
    for group, group_moves in ((moving, True), (staying, False)):
        await record_session_history(
            conn,
            dialect,
            group,
            phase=change.phase,
            result=change.result.value,
            to_status=to_status,
            now=now,
            moving=group_moves,
            notes=change.notes,
        )
    if target.kernel is not None:
        applied.kernels_moved += await _move_kernels(
            conn, dialect, passed, target.kernel, change, now, ask=target.ask
        )
    if to is not None and moving:
        started = to is SessionStatus.RUNNING
        await _session_move(to, started=started).run(conn, {"ids": moving.payload, "now": now})
    if change.count_attempt and staying:
        await _COUNT_ATTEMPT.run(conn, {"ids": staying.payload, "phase": change.phase})
    ends = to in SESSION_TERMINAL or change.records_cause
    await _write_notes(conn, dialect, change.notes, current, ends=ends)
    applied.sessions.update({sid: (status, to or status) for sid, status in current.items()})


# A kernel here can never go back to PENDING (the kernel table has no such edge).
_STRANDING = (KernelStatus.TERMINATING, *KERNEL_TERMINAL)
_STRANDED = DirectStatement(
    lambda dialect: (
        sa.select(kernels.c.session_id, kernels.c.cluster_index, kernels.c.status)
        .where(
            in_param(dialect, kernels.c.session_id, "ids"),
            in_constants(kernels.c.status, [s.value for s in _STRANDING]),
        )
        .order_by(kernels.c.session_id, kernels.c.cluster_index)
    )
)


async def _end_stranded(
    conn: AsyncConnection,
    dialect: Dialect,
    change: StatusChange,
    current: dict[SessionId, SessionStatus],
    now: datetime,
    applied: AppliedChanges,
) -> dict[SessionId, SessionStatus]:
    """Sessions sent back to PENDING whose kernels cannot all follow end instead; the rest.

    A session is placed whole, every kernel PENDING: one of whose kernels already ended (a rank
    of a multi-node session that finished early, then the session timed out or was evicted)
    would wait in the queue for ever, never placeable. It goes to TERMINATING instead, with the
    change's cause and a note saying why, and ends as an end asked for does (its other kernels
    stopped); a retry policy may then run it again whole, as a new attempt.
    """
    rows = await _STRANDED.rows(conn, {"ids": payload(dialect, list(current))})
    if not rows:
        return current
    ended: dict[SessionId, tuple[int, str]] = {}
    for session_id, index, status in rows:
        ended.setdefault(SessionId(session_id), (index, status))
    ended = {sid: seen for sid, seen in ended.items() if sid in current}
    notes = {}
    for sid, (index, status) in ended.items():
        why = change.notes.get(sid)
        notes[sid] = ResultNote(
            why.code if why is not None else FailureCause.PHASE_TIMEOUT.value,
            f"{why.message + '; ' if why is not None else ''}not requeued: its kernel {index} "
            f"already ended ({status}), and a session is placed whole, so it ends instead",
        )
    instead = StatusChange(
        list(ended),
        change.phase,
        change.result,
        frozenset(current[sid] for sid in ended),
        TransitionStatus(SessionStatus.TERMINATING),
        notes=notes,
        records_cause=True,
    )
    instead.validate()
    await _apply_one(conn, dialect, instead, now, applied)
    return {sid: status for sid, status in current.items() if sid not in ended}


async def _write_notes(
    conn: AsyncConnection,
    dialect: Dialect,
    notes: Mapping[SessionId, ResultNote],
    noted: Collection[SessionId],
    *,
    ends: bool,
) -> None:
    """The notes of the `noted` sessions on their rows; the cause too if they `ends`."""
    if not notes:
        return
    shared, rest = by_note(noted, notes)
    for note, sids in shared.items():
        await _shared_notes_update(ends).run(
            conn, {"ids": payload(dialect, sids), "info": note.message[:512], "cause": note.code}
        )
    if rest:
        await _notes_update(ends).run_many(
            conn,
            [
                {"sid": sid, "info": notes[sid].message[:512], "cause": notes[sid].code}
                for sid in rest
            ],
        )


async def _move_kernels(
    conn: AsyncConnection,
    dialect: Dialect,
    session_ids: IdBatch,
    to: KernelStatus,
    change: StatusChange,
    now: datetime,
    *,
    ask: KernelIntent | None = None,
) -> int:
    """Move the sessions' kernels to `to` (asking their agents for `ask`); return how many moved.

    Only kernels whose status may legally move to `to` are touched: a kernel that already
    ended (or already is there) keeps its status. The session rows are locked already, and
    every writer locks sessions before their kernels, so kernel locks cannot deadlock.
    """
    sources = [s.value for s in KERNEL_TRANSITIONS.sources(to)]
    await record_kernel_history(
        conn,
        dialect,
        session_ids,
        sources,
        phase=change.phase,
        result=change.result.value,
        to_status=to.value,
        now=now,
    )
    held = await _held_slots(conn, to, session_ids) if _gives_back(to) else {}
    if to is KernelStatus.PENDING and change.result in _FAILED_RESULTS:
        await _remember_failed_agents(conn, dialect, to, session_ids)
    if to is KernelStatus.PENDING:
        await _forget_agents(to).run(conn, {"ids": session_ids.payload})
    params = {"ids": session_ids.payload, "now": now}
    asked: set[AgentId] = set()
    if ask is None:
        moved = await _kernel_move(to, None).run(conn, params)
    else:
        holders = await _kernel_move(to, ask).scalars(conn, params)
        moved = len(holders)
        asked = {AgentId(agent_id) for agent_id in holders if agent_id is not None}
    await apply_slot_deltas(conn, held)
    # Kernels taken away from their agents (re-scheduled, or ended by the manager), or asked
    # for something new: the agents learn it from their assignments.
    await bump_revisions(conn, dialect, set(held) | asked)
    return moved


async def _held_slots(
    conn: AsyncConnection, to: KernelStatus, session_ids: IdBatch
) -> dict[AgentId, dict[str, int]]:
    """Negative deltas giving back what the sessions' kernels moving to `to` occupy (in SQL)."""
    rows = await _held_query(to).rows(conn, {"ids": session_ids.payload})
    deltas: dict[AgentId, dict[str, int]] = {}
    for agent_id, slot, amount in rows:
        deltas.setdefault(AgentId(agent_id), {})[slot] = -int(amount)
    return deltas


async def _remember_failed_agents(
    conn: AsyncConnection, dialect: Dialect, to: KernelStatus, session_ids: IdBatch
) -> None:
    """Add the agents holding the kernels that move to `to` to their sessions' failed agents."""
    rows = await conn.execute(
        sa.select(kernels.c.session_id, kernels.c.agent_id).where(
            _kernel_scope(dialect, to), kernels.c.agent_id.is_not(None)
        ),
        {"ids": session_ids.payload},
    )
    holders: dict[SessionId, list[str]] = {}
    for sid, agent_id in rows:
        holders.setdefault(SessionId(sid), []).append(agent_id)
    if not holders:
        return
    known = await conn.execute(
        sa.select(sessions.c.id, sessions.c.failed_agents).where(
            in_values(dialect, sessions.c.id, holders)
        )
    )
    updates = []
    for sid, failed in known:
        merged = list(dict.fromkeys([*failed, *holders[SessionId(sid)]]))
        updates.append({"sid": sid, "failed": merged})
    await conn.execute(
        sessions.update()
        .where(sessions.c.id == sa.bindparam("sid"))
        .values(failed_agents=sa.bindparam("failed", type_=sessions.c.failed_agents.type)),
        updates,
    )


# The statements of a change, built once per dialect and target (parameters: ids, now).


@functools.cache
def _session_move(to: SessionStatus, *, started: bool, ending: bool = False) -> DirectStatement:
    """Sessions moved to `to` (parameters: ids, now; result and code with an `ending`): started
    now if they entered (or a chain passed) RUNNING, ended now if `to` is terminal."""

    def build(dialect: Dialect) -> sa.Update:
        now = sa.bindparam("now", type_=sessions.c.status_changed_at.type)
        values: dict[str, Any] = {
            "status": to.value,
            "status_changed_at": now,
            "phase": None,
            "phase_attempts": 0,
        }
        if started:
            values["started_at"] = now
        if to is SessionStatus.RUNNING:
            values["deadline_at"] = _deadline(dialect, now)
        elif started or to in (SessionStatus.TERMINATING, SessionStatus.PENDING):
            values["deadline_at"] = None  # no longer running: out of the time limits' index
        values.update(kernels_ready_on_move(to, now))
        if to in SESSION_TERMINAL:
            values["terminated_at"] = now
        if ending:
            values["result"] = sa.bindparam("result", type_=sessions.c.result.type)
            values["exit_code"] = sa.bindparam("code", type_=sessions.c.exit_code.type)
        elif to in SESSION_TERMINAL:
            values["result"] = _default_result(to)
        return sessions.update().where(in_param(dialect, sessions.c.id, "ids")).values(**values)

    return DirectStatement(build)


def kernels_ready_on_move(to: SessionStatus, now: Any) -> dict[str, Any]:
    """The KernelsReady condition a session moved to `to` at `now` takes (spec document 2):
    not ready (`WaitForStart`) when admitted, ready once RUNNING (`Recovered` after a
    `WaitForRecovery`; not ready, `WaitForRecovery`, while a kernel is being restarted), no
    condition back in PENDING; other moves keep it."""
    if to is SessionStatus.SCHEDULED:
        return {
            "kernels_ready": sa.false(),
            "kernels_ready_reason": _reason(KernelsReadyReason.WAIT_FOR_START),
            "kernels_ready_at": now,
        }
    if to is SessionStatus.RUNNING:
        recovering = sessions.c.kernels_ready_reason == _reason(
            KernelsReadyReason.WAIT_FOR_RECOVERY
        )
        # A kernel that exited and is being restarted (the restart policy) before its
        # session ran: the session runs not ready, waiting for that kernel's recovery.
        restarting = sa.exists().where(
            kernels.c.session_id == sessions.c.id,
            kernels.c.restarting.is_(True),
            kernels.c.status == KernelStatus.RUNNING.value,
        )
        return {
            "kernels_ready": sa.not_(restarting),
            "kernels_ready_reason": sa.case(
                (restarting, _reason(KernelsReadyReason.WAIT_FOR_RECOVERY)),
                (recovering, _reason(KernelsReadyReason.RECOVERED)),
                else_=_reason(KernelsReadyReason.READY),
            ),
            "kernels_ready_at": now,
        }
    if to is SessionStatus.PENDING:
        return {"kernels_ready": None, "kernels_ready_reason": None, "kernels_ready_at": None}
    return {}


def _reason(reason: KernelsReadyReason) -> sa.ColumnElement[Any]:
    return sa.literal_column(f"'{reason.value}'", sa.String())


def _deadline(dialect: Dialect, now: sa.BindParameter[Any]) -> sa.ColumnElement[Any]:
    """`now` plus the session's time limit (NULL without one), in the dialect's arithmetic."""
    limit = sessions.c.time_limit_s
    if dialect == "postgresql":
        seconds = sa.type_coerce(limit * sa.literal_column("INTERVAL '1 second'"), sa.Interval())
        return now + seconds
    # SQLite keeps timestamps as text: the same form, to the millisecond.
    return sa.func.strftime(
        sa.literal_column("'%Y-%m-%d %H:%M:%f'"),
        now,
        sa.literal_column("'+'").concat(limit).concat(sa.literal_column("' seconds'")),
    )


def _default_result(to: SessionStatus) -> sa.ColumnElement[Any]:
    """The result of a session ended by a move that does not say it (not a promotion's ending):
    CANCELLED and ERROR have one; a TERMINATED one (its kernels stopped by the handler, not by
    the agents' reports) has the result its requested end gives, else failure (nothing says it
    succeeded)."""
    if to is SessionStatus.CANCELLED:
        return _literal(SessionResult.CANCELLED)
    if to is SessionStatus.TERMINATED:
        return sa.case(
            *(
                (sessions.c.failure_cause == _literal(cause), _literal(result))
                for cause, result in REQUESTED_RESULTS.items()
            ),
            else_=_literal(SessionResult.FAILURE),
        )
    return _literal(SessionResult.FAILURE)


def _literal(value: str) -> sa.ColumnElement[str]:
    """A constant written into the SQL of a statement built once (`_direct`)."""
    return sa.literal_column("'" + value.replace("'", "''") + "'", sa.String())


# A failed attempt that keeps its status (parameters: ids, phase).
_COUNT_ATTEMPT = DirectStatement(
    lambda dialect: (
        sessions.update()
        .where(in_param(dialect, sessions.c.id, "ids"))
        .values(
            phase=sa.bindparam("phase", type_=sa.String()),
            phase_attempts=sa.case(
                (
                    sessions.c.phase == sa.bindparam("phase", type_=sa.String()),
                    sessions.c.phase_attempts + 1,
                ),
                else_=1,
            ),
        )
    )
)


def _notes_values(records_cause: bool) -> dict[str, Any]:
    return {
        "status_info": sa.bindparam("info", type_=sa.String()),
        "failure_cause": (
            sa.bindparam("cause", type_=sa.String()) if records_cause else sessions.c.failure_cause
        ),
    }


@functools.cache
def _notes_update(records_cause: bool) -> DirectStatement:
    """The sessions' notes (parameters per row: sid, info, cause); the cause only if they end."""
    return DirectStatement(
        lambda _dialect: (
            sessions.update()
            .where(sessions.c.id == sa.bindparam("sid", type_=sessions.c.id.type))
            .values(**_notes_values(records_cause))
        )
    )


@functools.cache
def _shared_notes_update(records_cause: bool) -> DirectStatement:
    """One note for many sessions (parameters: ids, info, cause); a session that already
    carries it (waiting, noted so by the pass before) is not written again."""

    def build(dialect: Dialect) -> sa.Update:
        where = [in_param(dialect, sessions.c.id, "ids")]
        if not records_cause:
            where.append(sessions.c.status_info.is_distinct_from(sa.bindparam("info")))
        return sessions.update().where(*where).values(**_notes_values(records_cause))

    return DirectStatement(build)


def _gives_back(to: KernelStatus) -> bool:
    """Whether kernels moving to `to` give their agents' slots back (re-placed, or ended)."""
    return to is KernelStatus.PENDING or to in KERNEL_TERMINAL


def _kernel_scope(dialect: Dialect, to: KernelStatus) -> sa.ColumnElement[bool]:
    """The kernels of the sessions in `ids` that may legally move to `to`."""
    sources = [s.value for s in KERNEL_TRANSITIONS.sources(to)]
    return sa.and_(
        in_param(dialect, kernels.c.session_id, "ids"), in_constants(kernels.c.status, sources)
    )


@functools.cache
def _kernel_move(to: KernelStatus, ask: KernelIntent | None) -> DirectStatement:
    """Kernels moved to `to` (parameters: ids, now); with `ask`, also asked for it (as
    `assignments.request_kernels` asks: a new generation, the stage failure cleared), and the
    statement returns each moved kernel's agent."""

    def build(dialect: Dialect) -> sa.Update:
        values: dict[str, Any] = {
            "status": to.value,
            "status_changed_at": sa.bindparam("now", type_=kernels.c.status_changed_at.type),
        }
        if _gives_back(to):
            values["occupied_slots"] = sa.null()
        if to is KernelStatus.PENDING:
            # The kernel starts over: no agent, nothing asked of anyone.
            values.update(agent_id=None, desired_state=None, stage_failure=None)
        if ask is not None:
            values.update(
                desired_state=ask.value,
                desired_generation=kernels.c.desired_generation + 1,
                stage_failure=None,
            )
        statement = kernels.update().where(_kernel_scope(dialect, to)).values(**values)
        return statement if ask is None else statement.returning(kernels.c.agent_id)

    return DirectStatement(build)


@functools.cache
def _forget_agents(to: KernelStatus) -> DirectStatement:
    """`agent_kernels.forget_agents` for the kernels moving to `to` (parameter: ids)."""
    return DirectStatement(lambda dialect: forgetting(_kernel_scope(dialect, to)))


@functools.cache
def _held_query(to: KernelStatus) -> DirectStatement:
    def build(dialect: Dialect) -> sa.Select[Any]:
        each = slot_entries(dialect, kernels.c.occupied_slots)
        amount = sa.func.sum(sa.cast(each.c.value, sa.BigInteger))
        return (
            sa.select(kernels.c.agent_id, each.c.key, amount)
            .select_from(kernels.join(each, sa.true()))
            .where(
                _kernel_scope(dialect, to),
                kernels.c.agent_id.is_not(None),
                kernels.c.occupied_slots.is_not(None),
            )
            .group_by(kernels.c.agent_id, each.c.key)
        )

    return DirectStatement(build)
