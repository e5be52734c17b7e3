"""Promotion handlers run by the coordinator on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sqlalchemy as sa

from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.hints import Hint
from corral.coordination.promotion import run_promotion
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.handlers.sessions.promotions import (
    PROMOTION_HANDLERS,
    DetectTermination,
    PromoteToPrepared,
    PromoteToRunning,
)
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database
from corral.store.sessions import SessionRepository
from corral.store.tables import kernels, session_history
from tests.integration.store._factories import NOW, add_session_ids, add_user, update_sessions

S, K = SessionStatus, KernelStatus


async def two_kernel_sessions(
    db: Database, status: SessionStatus, kernel_states: Sequence[tuple[K, K]]
) -> list[SessionId]:
    """One 2-kernel session in `status` per pair of kernel statuses."""
    ids = await add_session_ids(db, await add_user(db), len(kernel_states), cluster_size=2)
    await update_sessions(db, ids, status=status.value)
    for sid, states in zip(ids, kernel_states, strict=True):
        async with db.transaction() as conn:
            for index, state in enumerate(states):
                await conn.execute(
                    kernels.update()
                    .where(kernels.c.session_id == sid, kernels.c.cluster_index == index)
                    .values(status=state.value)
                )
    return ids


async def statuses(db: Database, ids: Sequence[SessionId]) -> list[SessionStatus]:
    """The sessions' statuses, in the order of `ids`."""
    by_id = {s.id: s.status for s in await SessionRepository(db).get(ids)}
    return [by_id[sid] for sid in ids]


async def test_prepared_only_when_no_kernel_is_still_preparing(db: Database) -> None:
    """NOT_ANY: a session is PREPARED once every kernel passed PULLING; kernels are untouched."""
    ready, pulling = await two_kernel_sessions(
        db, S.PREPARING, [(K.PREPARED, K.PREPARED), (K.PREPARED, K.PULLING)]
    )
    applied = await run_promotion(db, PromoteToPrepared(), NOW)
    assert applied.moved() == {ready: (S.PREPARING, S.PREPARED)}
    assert await statuses(db, [ready, pulling]) == [S.PREPARED, S.PREPARING]
    [session] = await SessionRepository(db).get([ready])
    assert [k.status for k in session.kernels] == [K.PREPARED, K.PREPARED]
    async with db.read() as conn:
        rows = (
            await conn.execute(
                sa.select(session_history.c.phase, session_history.c.to_status).where(
                    session_history.c.session_id == ready
                )
            )
        ).all()
    assert [tuple(r) for r in rows] == [("PromoteToPrepared", "PREPARED")]


async def test_running_only_when_every_kernel_runs(db: Database) -> None:
    """A CREATING session with one kernel still CREATING stays; all RUNNING promotes it."""
    up, starting = await two_kernel_sessions(
        db, S.CREATING, [(K.RUNNING, K.RUNNING), (K.RUNNING, K.CREATING)]
    )
    await run_promotion(db, PromoteToRunning(), NOW)
    assert await statuses(db, [up, starting]) == [S.RUNNING, S.CREATING]


async def test_any_ended_kernel_sends_a_running_session_to_terminating(db: Database) -> None:
    """ANY: one kernel that ended (success or failure) is enough to start terminating."""
    ended, failed, running = await two_kernel_sessions(
        db,
        S.RUNNING,
        [(K.TERMINATED, K.RUNNING), (K.RUNNING, K.ERROR), (K.RUNNING, K.RUNNING)],
    )
    applied = await run_promotion(db, DetectTermination(), NOW)
    assert set(applied.moved()) == {ended, failed}
    assert await statuses(db, [ended, failed, running]) == [S.TERMINATING, S.TERMINATING, S.RUNNING]


async def test_nothing_to_promote_is_a_no_op(db: Database) -> None:
    """Without targets or matches, nothing is written."""
    assert (await run_promotion(db, PromoteToRunning(), NOW)).sessions == {}
    [waiting] = await two_kernel_sessions(db, S.CREATING, [(K.CREATING, K.CREATING)])
    assert (await run_promotion(db, PromoteToRunning(), NOW)).sessions == {}
    assert await statuses(db, [waiting]) == [S.CREATING]


async def test_a_start_wakes_termination_detection_only_for_a_kernel_already_ended(
    db: Database,
) -> None:
    """DetectTermination scans every RUNNING session, so a start wakes it only when needed.

    A kernel may end while its session is still CREATING; its report's hint then came too
    early, and the start is what must wake the detection.
    """
    hints = MemoryHintBus()
    coordinator = SessionCoordinator(db, hints)
    [clean] = await two_kernel_sessions(db, S.CREATING, [(K.RUNNING, K.RUNNING)])
    assert (await coordinator.run_promotion(PromoteToRunning())).changed == 1
    assert await statuses(db, [clean]) == [S.RUNNING]
    assert not await hints.consume(Hint.DETECT_TERMINATION.value)

    [early] = await two_kernel_sessions(db, S.CREATING, [(K.RUNNING, K.TERMINATED)])
    await coordinator.run_promotion(PromoteToRunning())
    assert await statuses(db, [early]) == [S.RUNNING]
    assert await hints.consume(Hint.DETECT_TERMINATION.value)
    await coordinator.run_promotion(DetectTermination())
    assert await statuses(db, [clean, early]) == [S.RUNNING, S.TERMINATING]


async def test_the_promotion_query_and_its_rule_in_python_agree(db: Database) -> None:
    """Each handler's promotion query (the tasks') and `promotes` (the reports' path) pick
    the same sessions, over every session status a handler targets and every pair of kernel
    statuses."""
    pairs = list(itertools.combinations_with_replacement(list(K), 2))
    targeted = sorted({s for h in PROMOTION_HANDLERS for s in h.target_session_statuses})
    by_status = {status: await two_kernel_sessions(db, status, pairs) for status in targeted}
    progress = {
        p.id: p
        for p in await SessionRepository(db).progress(
            [sid for ids in by_status.values() for sid in ids]
        )
    }
    assert len(progress) == len(targeted) * len(pairs)
    for handler in PROMOTION_HANDLERS:
        queried = await SessionRepository(db).promotable(
            handler.target_session_statuses, handler.check_kernel_statuses, handler.match_type
        )
        in_python = {sid for sid, session in progress.items() if handler.promotes(session)}
        assert queried == in_python, handler.name()
        assert in_python, f"{handler.name()} promoted nothing: the test would prove nothing"
