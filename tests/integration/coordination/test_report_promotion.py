"""Promotions made at once by the agents' reports (`SessionCoordinator.promote_reported`), on
SQLite and PostgreSQL: the reports path promotes the sessions it concerns as far as their
kernels allow, with the history, events and hints the promotion tasks would have written."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest
import sqlalchemy as sa

from corral.controller.agents import AgentController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.hints import PROMOTION_HINTS, Hint
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.infra.events.memory import MemoryEventBus
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.kernel_reports import KernelReport
from corral.store.sessions import SessionRepository
from corral.store.tables import kernels, sessions
from tests.integration.coordination._harness import LIFECYCLE, make_cluster
from tests.integration.store._factories import (
    add_agents,
    add_session_ids,
    add_user,
    place_all,
    update_sessions,
)

S, K = SessionStatus, KernelStatus


async def creating_sessions(
    db: Database, count: int, *, cluster_size: int = 1
) -> tuple[AgentId, list[SessionId], dict[SessionId, list[KernelId]]]:
    """`count` sessions placed on one agent, in CREATING with their kernels CREATING."""
    [agent] = await add_agents(db, [{"cpu": 64_000}])
    ids = await add_session_ids(db, await add_user(db), count, cluster_size=cluster_size)
    await place_all(db, ids, agent)
    await update_sessions(db, ids, status=S.CREATING.value)
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update().where(kernels.c.session_id.in_(ids)).values(status=K.CREATING.value)
        )
    kernel_ids: dict[SessionId, list[KernelId]] = {}
    for session in await SessionRepository(db).get(ids):
        kernel_ids[session.id] = [
            k.id for k in sorted(session.kernels, key=lambda k: k.cluster_index)
        ]
    return agent, ids, kernel_ids


async def set_hints(hints: MemoryHintBus, names: Iterable[Hint]) -> set[Hint]:
    """Which of `names` were set (each is cleared by looking)."""
    return {name for name in names if await hints.consume(name.value)}


async def phases(db: Database, sid: SessionId) -> list[tuple[str, str | None]]:
    from corral.store.tables import session_history as h

    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(h.c.phase, h.c.to_status).where(h.c.session_id == sid).order_by(h.c.id)
        )
        return [(phase, to) for phase, to in rows]


async def test_a_report_promotes_its_sessions_at_once(db: Database) -> None:
    """A kernel reported RUNNING then TERMINATED (exit 0) carries its CREATING session to
    TERMINATED in the report's call, one history row and one event per move; a session
    whose kernel only started is RUNNING. No promotion task is woken; the ended session's
    freed capacity wakes the scheduler."""
    agent, (done, up), kernel_ids = await creating_sessions(db, 2)
    hints, events = MemoryHintBus(), MemoryEventBus("test")
    coordinator = SessionCoordinator(db, hints, events)
    controller = AgentController(db, hints, join_token=None, promote=coordinator.promote_reported)
    async with events.subscribe() as subscription:
        await controller.report(
            agent,
            [
                KernelReport(kernel_ids[done][0], K.RUNNING),
                KernelReport(kernel_ids[done][0], K.TERMINATED, exit_code=0),
                KernelReport(kernel_ids[up][0], K.RUNNING),
            ],
        )
        published = [await anext(subscription) for _ in range(4)]

    found = {s.id: s.status for s in await SessionRepository(db).get([done, up])}
    assert found == {done: S.TERMINATED, up: S.RUNNING}
    async with db.read() as conn:
        result, code = (
            await conn.execute(
                sa.select(sessions.c.result, sessions.c.exit_code).where(sessions.c.id == done)
            )
        ).one()
    assert (result, code) == ("success", 0)
    assert (await phases(db, done))[-3:] == [
        ("PromoteToRunning", "RUNNING"),
        ("DetectTermination", "TERMINATING"),
        ("PromoteToTerminated", "TERMINATED"),
    ]
    stored = [
        (e.payload["from"], e.payload["to"], e.payload["reason"])
        for e in await read_events(db, entity_id=str(done))
    ]
    assert stored[-3:] == [
        ("CREATING", "RUNNING", "PromoteToRunning"),
        ("RUNNING", "TERMINATING", "DetectTermination"),
        ("TERMINATING", "TERMINATED", "PromoteToTerminated"),
    ]
    assert sorted((e.entity_id, e.payload["to"]) for e in published) == sorted(
        [
            (str(done), "RUNNING"),
            (str(done), "TERMINATING"),
            (str(done), "TERMINATED"),
            (str(up), "RUNNING"),
        ]
    )
    assert await set_hints(hints, PROMOTION_HINTS | {Hint.TERMINATE}) == set()
    assert await set_hints(hints, [Hint.SCHEDULE]) == {Hint.SCHEDULE}


async def test_a_session_waits_for_its_last_kernel(db: Database) -> None:
    """Two kernels reported RUNNING in two reports: the first leaves the session CREATING (its
    sibling has not started), the second promotes it."""
    agent, [sid], kernel_ids = await creating_sessions(db, 1, cluster_size=2)
    hints = MemoryHintBus()
    coordinator = SessionCoordinator(db, hints)
    controller = AgentController(db, hints, join_token=None, promote=coordinator.promote_reported)
    first, second = kernel_ids[sid]
    await controller.report(agent, [KernelReport(first, K.RUNNING)])
    assert [s.status for s in await SessionRepository(db).get([sid])] == [S.CREATING]
    await controller.report(agent, [KernelReport(second, K.RUNNING)])
    assert [s.status for s in await SessionRepository(db).get([sid])] == [S.RUNNING]


async def test_moves_that_cannot_promote_read_nothing(db: Database) -> None:
    """Only a move that can make some handler's rule hold leads to a read of its session."""
    hints = MemoryHintBus()
    coordinator = SessionCoordinator(db, hints)
    sid = SessionId(await add_user(db))  # any id: nothing is read for these moves
    assert await coordinator.promote_reported([(sid, K.PREPARING, K.PULLING)]) == set()
    assert await coordinator.promote_reported([(sid, K.RUNNING, K.TERMINATING)]) == set()
    assert await coordinator.promote_reported([(sid, K.CREATING, K.RUNNING)]) == {sid}


async def test_a_failed_promotion_leaves_it_to_the_tasks(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """If promoting fails, the reports stay applied, the failure is logged, and the tasks'
    hints are set so a promotion run does it instead."""
    agent, [sid], kernel_ids = await creating_sessions(db, 1)
    hints = MemoryHintBus()

    async def broken(_moves: object) -> None:
        raise RuntimeError("database went away")

    controller = AgentController(db, hints, join_token=None, promote=broken)
    with caplog.at_level(logging.ERROR):
        await controller.report(agent, [KernelReport(kernel_ids[sid][0], K.RUNNING)])
    assert "agent.reports.promotion_failed" in caplog.text
    [session] = await SessionRepository(db).get([sid])
    assert session.status is S.CREATING
    assert [k.status for k in session.kernels] == [K.RUNNING]
    assert await set_hints(hints, [Hint.PROMOTE_RUNNING]) == {Hint.PROMOTE_RUNNING}
    await SessionCoordinator(db, hints).run_all()
    assert [s.status for s in await SessionRepository(db).get([sid])] == [S.RUNNING]


async def test_a_whole_lifecycle_with_promotions_on_report(db: Database) -> None:
    """Test agents that promote on report take a session through every status, each move
    by its own phase, as the promotion tasks would."""
    cluster = await make_cluster(db, [{"cpu": 4000}])
    cluster.agent.exit_code = lambda _kernel: 0
    cluster.agent.promote = cluster.coordinator.promote_reported
    sid = await cluster.submit()
    await cluster.settle()
    moves = [to for _, _, to, _ in await cluster.moves_of(sid) if to is not None]
    assert tuple(dict.fromkeys(moves)) == LIFECYCLE[1:]
    assert await cluster.status(sid) is S.TERMINATED
