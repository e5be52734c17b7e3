"""Promotions: a handler's run over all its targets, and the chain of promotions that agents'
reports make due for the sessions they concern."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.coordination.quarantine import Quarantine
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.session import SessionProgress
from corral.domain.status import SESSION_TERMINAL, SessionStatus
from corral.domain.types import SessionId
from corral.handlers.base import Ending, SessionPromotionHandler
from corral.store.database import Database
from corral.store.sessions import SessionRepository
from corral.store.status_changes import AppliedChanges, ChainedMoves, StatusChange, apply_chains
from corral.store.unavailable import database_unavailable

OnApplied = Callable[[AsyncConnection, AppliedChanges], Awaitable[None]]
# Runs last in a promotion's transaction, after every round was written and told.
Then = Callable[[AsyncConnection], Awaitable[None]]


async def run_promotion(
    db: Database,
    handler: SessionPromotionHandler,
    now: datetime,
    *,
    on_applied: OnApplied | None = None,
    then: Then | None = None,
    quarantine: Quarantine | None = None,
) -> AppliedChanges:
    """Promote every session of the handler's targets whose kernels meet its condition.

    Three steps whatever the number of sessions: one query for the targets whose kernels
    match, one for their statuses and kernels (`promote_sessions`; PromoteToTerminated ends
    each in its own terminal status with its result and exit code), and the guarded promotion
    (with history); a session that moved meanwhile is left alone. One move per session: the
    next promotion is the next task's.
    """
    promoted = await SessionRepository(db).promotable(
        handler.target_session_statuses, handler.check_kernel_statuses, handler.match_type
    )
    if not promoted:
        return AppliedChanges()

    async def finish(conn: AsyncConnection, applied: AppliedChanges, _step: PromotionStep) -> None:
        if on_applied is not None:
            await on_applied(conn, applied)

    applied = await promote_sessions(
        db, [handler], promoted, now, on_step=finish, then=then, quarantine=quarantine
    )
    return applied[0] if applied else AppliedChanges()


def _has_endings(handler: SessionPromotionHandler) -> bool:
    return type(handler).endings is not SessionPromotionHandler.endings


def _note(endings: Mapping[SessionId, Ending], sid: SessionId) -> ResultNote | None:
    ending = endings.get(sid)
    return ending.note if ending is not None else None


@dataclass(slots=True)
class PromotionStep:
    """One round of a chain of promotions: every session's next move, applied together."""

    changes: list[StatusChange] = field(default_factory=list)
    phases: dict[SessionId, str] = field(default_factory=dict)  # session → the handler moving it
    endings: dict[SessionId, Ending] = field(default_factory=dict)  # for those that end


def plan_promotions(
    handlers: Sequence[SessionPromotionHandler], targets: Sequence[SessionProgress], now: datetime
) -> list[PromotionStep]:
    """Every promotion due for `targets` as they stand, chained: round by round, the moves to
    apply in order.

    A session moves with the first handler (in `handlers`' order) whose rule holds for it,
    then again from where that left it, until none holds or it ended: a session whose only
    kernel went from CREATING to TERMINATED is promoted to RUNNING, then TERMINATING, then
    ended, each move by its own handler, as the tasks would have done one after another. A
    session promoted to RUNNING counts as started for its ending.
    """
    rounds: list[dict[tuple[SessionPromotionHandler, SessionStatus], list[SessionId]]] = []
    steps: list[PromotionStep] = []
    for session in targets:
        current = session
        for depth in range(len(handlers)):
            handler = next((h for h in handlers if h.promotes(current)), None)
            if handler is None:
                break
            if depth == len(steps):
                steps.append(PromotionStep())
                rounds.append({})
            ending = handler.endings([current]).get(current.id) if _has_endings(handler) else None
            to = ending.status if ending is not None else handler.success_session_status()
            rounds[depth].setdefault((handler, to), []).append(current.id)
            steps[depth].phases[current.id] = handler.name()
            if ending is not None:
                steps[depth].endings[current.id] = ending
            if to in SESSION_TERMINAL:
                break
            started_at = now if to is SessionStatus.RUNNING else current.started_at
            current = SessionProgress(current.id, to, started_at, current.kernels, current.cause)
    for step, moves in zip(steps, rounds, strict=True):
        step.changes = [
            StatusChange(
                ids,
                handler.name(),
                SchedulingResult.SUCCESS,
                handler.target_session_statuses,
                TransitionStatus(to),
                notes={sid: note for sid in ids if (note := _note(step.endings, sid)) is not None},
            )
            for (handler, to), ids in moves.items()
        ]
    return steps


OnStep = Callable[[AsyncConnection, AppliedChanges, "PromotionStep"], Awaitable[None]]


async def promote_sessions(
    db: Database,
    handlers: Sequence[SessionPromotionHandler],
    session_ids: Collection[SessionId],
    now: datetime,
    *,
    on_step: OnStep | None = None,
    then: Then | None = None,
    quarantine: Quarantine | None = None,
) -> list[AppliedChanges]:
    """Promote these sessions as far as their kernels allow now, in one transaction.

    One query reads the sessions and their kernels, `plan_promotions` chains the moves, and
    the chains are applied (`apply_chains`), each guarded by the status its first handler
    expects (a session that moved meanwhile is left alone): every move gets its history, and
    a session's row is written once, where its chain ends, with the result and exit code of an
    ending. `on_step` runs inside the transaction for each round, in order, and `then` once
    after the last (not at all when nothing was due).

    With `quarantine`, a batch that fails on its data (not on an unavailable database) is
    promoted in halves, down to the one session whose row cannot be handled, which is isolated
    (`coordination.quarantine`): one poisoned session costs its batch a few more transactions,
    never the promotion of the others.
    """
    try:
        return await _promote(db, handlers, session_ids, now, on_step, then)
    except _DATA_ERRORS as exc:
        if quarantine is None or database_unavailable(exc):
            raise
        failed = exc
    ids = sorted(set(session_ids))
    if len(ids) == 1:
        try:
            await quarantine.isolate({ids[0]: str(failed)[:300]}, where=_WHERE)
        except _DATA_ERRORS as exc:
            if database_unavailable(exc):
                raise
            quarantine.skipped(_WHERE, ids[0], exc)
        return []
    half = len(ids) // 2
    halves = [ids[:half], ids[half:]]
    first, second = [
        await promote_sessions(
            db, handlers, part, now, on_step=on_step, then=then, quarantine=quarantine
        )
        for part in halves
    ]
    return _merged(first, second)


_WHERE = "promotion"
# What a batch fails with when some row of it cannot be handled: the database refusing a write,
# or the planning refusing a value.
_DATA_ERRORS = (sa.exc.DBAPIError, ValueError, TypeError, KeyError)


def _merged(first: list[AppliedChanges], second: list[AppliedChanges]) -> list[AppliedChanges]:
    """Two promotions' rounds as one's: round i of both together."""
    rounds: list[AppliedChanges] = []
    for index in range(max(len(first), len(second))):
        merged = AppliedChanges()
        for part in (first, second):
            if index < len(part):
                merged.sessions.update(part[index].sessions)
                merged.kernels_moved += part[index].kernels_moved
                merged.stale.update(part[index].stale)
                merged.owners.update(part[index].owners)
        rounds.append(merged)
    return rounds


async def _promote(
    db: Database,
    handlers: Sequence[SessionPromotionHandler],
    session_ids: Collection[SessionId],
    now: datetime,
    on_step: OnStep | None,
    then: Then | None,
) -> list[AppliedChanges]:
    targets = await SessionRepository(db).progress(session_ids)
    steps = plan_promotions(handlers, targets, now)
    if not steps:
        return []
    rounds = iter(steps)
    last = steps[-1]

    async def finish(conn: AsyncConnection, applied: AppliedChanges) -> None:
        step = next(rounds)
        if on_step is not None:
            await on_step(conn, applied, step)
        if step is last and then is not None:
            await then(conn)

    return await apply_chains(db, chains_of(steps), now, on_step=finish)


def chains_of(steps: Sequence[PromotionStep]) -> list[ChainedMoves]:
    """The rounds of `plan_promotions` as chains: the sessions moved alike in every round (the
    same phases to the same statuses), each chain guarded as its first round was."""
    paths: dict[SessionId, list[tuple[str, SessionStatus]]] = {}
    guards: dict[SessionId, frozenset[SessionStatus]] = {}
    notes: dict[SessionId, ResultNote] = {}
    for depth, step in enumerate(steps):
        for change in step.changes:
            assert change.target is not None and change.target.session is not None
            move = (change.phase, change.target.session)
            for sid in change.session_ids:
                paths.setdefault(sid, []).append(move)
                if depth == 0:
                    guards[sid] = change.expected
            notes.update(change.notes)
    endings = {
        sid: (ending.result, ending.exit_code)
        for step in steps
        for sid, ending in step.endings.items()
    }
    alike: dict[
        tuple[frozenset[SessionStatus], tuple[tuple[str, SessionStatus], ...]], list[SessionId]
    ] = {}
    for sid, path in paths.items():
        alike.setdefault((guards[sid], tuple(path)), []).append(sid)
    return [
        ChainedMoves(
            sids,
            expected,
            moves,
            notes={sid: notes[sid] for sid in sids if sid in notes},
            endings={sid: endings[sid] for sid in sids if sid in endings},
        )
        for (expected, moves), sids in alike.items()
    ]
