"""Native session retry (spec document 5) through the real coordinator, store and test agents.

Every test runs on SQLite and PostgreSQL with instant test agents and an injected clock: the
delay between attempts passes by moving the clock, never by sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.metrics import CoordinatorMetrics
from corral.domain.events import SESSION_RETRY_EXHAUSTED, SESSION_RETRY_SCHEDULED
from corral.domain.retry.decide import RetryDecision
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.retries import read_chain, write_retry_switch
from corral.store.tables import sessions
from corral.testing.agent import AssignedKernel
from tests.integration.coordination._harness import Cluster, make_cluster

S = SessionStatus
CPU4 = {"cpu": 4000, "mem": 8 * 2**30 * 1000}
DELAY_S = 30.0
POLICY = {"max_retries": 2, "retry_delay": DELAY_S, "jitter": "none"}


def _exits(*codes: int) -> Callable[[AssignedKernel], int | None]:
    """Each started kernel exits with the next of `codes` (the last one from then on)."""
    left = list(codes)

    def code(_kernel: AssignedKernel) -> int | None:
        return left.pop(0) if len(left) > 1 else left[0]

    return code


async def _failing_cluster(db: Database, *codes: int) -> tuple[Cluster, CoordinatorMetrics]:
    c = await make_cluster(db, [CPU4], exit_code=_exits(*codes), nonzero_exit_fails=True)
    metrics = CoordinatorMetrics()
    c.coordinator.metrics = metrics
    return c, metrics


async def _chain_ends(c: Cluster, sid: SessionId, attempts: int) -> list[Any]:
    """Settle, and pass each retry's delay, until the chain has `attempts` attempts ended."""
    for _ in range(attempts + 2):
        await c.settle()
        chain = await read_chain(c.db, sid)
        if len(chain) == attempts and all(a.link.status in (S.ERROR, S.TERMINATED) for a in chain):
            await c.settle()
            return await read_chain(c.db, sid)
        c.clock.advance(DELAY_S + 1)
    raise AssertionError(f"the chain did not reach {attempts} ended attempts: {chain}")


async def _events(db: Database, kind: str) -> list[Any]:
    return [e for e in await read_events(db, after_id=0, limit=10_000) if e.kind == kind]


def _count(metrics: CoordinatorMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_an_always_failing_session_is_run_three_times_then_exhausted(db: Database) -> None:
    """max_retries=2: a chain of 3 attempts, each ERROR kernel_nonzero_exit, then exhausted."""
    c, metrics = await _failing_cluster(db, 3)
    sid = await c.submit(retry_policy=POLICY)
    chain = await _chain_ends(c, sid, 3)
    assert [(a.link.status, a.link.failure_cause, a.exit_code) for a in chain] == [
        (S.ERROR, "kernel_nonzero_exit", 3)
    ] * 3
    assert [a.link.retry_count for a in chain] == [0, 1, 2]
    assert [a.retry_cause for a in chain] == [None, "kernel_nonzero_exit", "kernel_nonzero_exit"]
    assert [a.link.retry_decision for a in chain] == ["scheduled", "scheduled", "exhausted"]
    # Each retry waited its delay after its parent's end, on the injected clock.
    for parent, child in itertools.pairwise(chain):
        assert parent.terminated_at is not None and child.terminated_at is not None
        assert child.link.starts_at == parent.terminated_at + timedelta(seconds=DELAY_S)
        assert child.terminated_at - parent.terminated_at >= timedelta(seconds=DELAY_S)
    exhausted = await _events(db, SESSION_RETRY_EXHAUSTED)
    assert [(e.entity_id, e.payload["cause"]) for e in exhausted] == [
        (str(chain[-1].link.id), "kernel_nonzero_exit")
    ]
    scheduled = await _events(db, SESSION_RETRY_SCHEDULED)
    assert [e.payload["attempt"] for e in scheduled] == [2, 3]
    assert {e.payload["delay_s"] for e in scheduled} == {DELAY_S}
    cause = {"cause": "kernel_nonzero_exit"}
    assert _count(metrics, "corral_session_retry_scheduled_total", **cause) == 2
    assert _count(metrics, "corral_session_retry_exhausted_total", **cause) == 1
    assert _count(metrics, "corral_session_retry_succeeded_total") == 0


async def test_a_session_failing_once_then_succeeding_is_a_chain_of_two(db: Database) -> None:
    """Fails, is retried, succeeds: a chain of 2, and one retry counted as succeeded."""
    c, metrics = await _failing_cluster(db, 1, 0)
    sid = await c.submit(retry_policy=POLICY)
    chain = await _chain_ends(c, sid, 2)
    assert [(a.link.status, a.link.result) for a in chain] == [
        (S.ERROR, "failure"),
        (S.TERMINATED, "success"),
    ]
    assert [a.link.retry_decision for a in chain] == ["scheduled", "succeeded"]
    assert _count(metrics, "corral_session_retry_succeeded_total") == 1
    assert await _events(db, SESSION_RETRY_EXHAUSTED) == []


async def test_a_user_cancelled_session_is_never_retried(db: Database) -> None:
    """Terminated by its user while it runs: it ends cancelled, and its chain is stopped."""
    c = await make_cluster(db, [CPU4])  # kernels keep running
    sid = await c.submit(retry_policy=POLICY)
    await c.settle()
    assert await c.status(sid) is S.RUNNING
    outcome = await c.controller.mark_terminate([sid], "user request")
    assert outcome.chain_stopped
    await c.settle()
    c.clock.advance(DELAY_S + 1)
    await c.settle()
    chain = await read_chain(db, sid)
    assert [(a.link.status, a.link.result, a.link.retry_decision) for a in chain] == [
        (S.TERMINATED, "cancelled", RetryDecision.STOPPED)
    ]


async def test_a_cause_not_in_eligible_causes_is_not_retried(db: Database) -> None:
    """A policy that retries only OOM kills does not retry a non-zero exit."""
    c, metrics = await _failing_cluster(db, 1)
    sid = await c.submit(retry_policy={**POLICY, "eligible_causes": ["oom_killed"]})
    await c.settle()
    chain = await read_chain(db, sid)
    assert [(a.link.status, a.link.retry_decision) for a in chain] == [
        (S.ERROR, RetryDecision.NOT_RETRIED)
    ]
    assert _count(metrics, "corral_session_retry_scheduled_total", cause="kernel_nonzero_exit") == 0


async def test_terminating_a_failed_attempt_cancels_its_waiting_retry(db: Database) -> None:
    """The retry waits for its delay; terminating the failed parent cancels it and stops all."""
    c, _ = await _failing_cluster(db, 1)
    sid = await c.submit(retry_policy=POLICY)
    await c.settle()
    (_, retry) = await read_chain(db, sid)
    assert retry.link.status is S.PENDING
    outcome = await c.controller.mark_terminate([sid], "user request")
    assert outcome.unchanged == [sid]
    assert (outcome.chain_stopped, outcome.chain) == (True, [retry.link.id])
    c.clock.advance(DELAY_S + 1)
    await c.settle()
    chain = await read_chain(db, sid)
    assert [(a.link.status, a.link.retry_decision) for a in chain] == [
        (S.ERROR, RetryDecision.SCHEDULED),
        (S.CANCELLED, RetryDecision.STOPPED),
    ]


async def test_two_coordinators_deciding_one_failure_create_exactly_one_child(
    db: Database, database_url: str
) -> None:
    """Two managers (two pools) run the retry task at once: one child, decided once."""
    c, _ = await _failing_cluster(db, 1)
    sids = [await c.submit(retry_policy=POLICY) for _ in range(20)]
    tasks = [t for t in c.coordinator.tasks() if t.name != "DispatchRetries"]
    for _ in range(40):  # every phase, but not the retries' decisions
        moved = sum([(await t.run()).changed for t in tasks]) + await c.agent.step()
        if not moved:
            break
    assert {await c.status(sid) for sid in sids} == {S.ERROR}
    other_db = Database.open(database_url)
    try:
        other = SessionCoordinator(other_db, c.hints, c.events, clock=c.clock)
        first, second = await asyncio.gather(c.coordinator.run_retries(), other.run_retries())
    finally:
        await other_db.close()
    assert first.changed + second.changed == len(sids)
    async with db.read() as conn:
        children = (
            await conn.execute(
                sa.select(sessions.c.parent_session_id, sa.func.count())
                .where(sessions.c.parent_session_id.is_not(None))
                .group_by(sessions.c.parent_session_id)
            )
        ).all()
    assert sorted(parent for parent, _ in children) == sorted(sids)
    assert {count for _, count in children} == {1}


async def test_a_manager_restarted_during_the_delay_starts_the_retry_on_time(
    db: Database, database_url: str
) -> None:
    """The delay is in the database: a new manager places the retry after it, not before."""
    c, _ = await _failing_cluster(db, 1, 0)
    sid = await c.submit(retry_policy=POLICY)
    await c.settle()
    (parent, retry) = await read_chain(db, sid)
    assert retry.link.starts_at is not None and parent.terminated_at is not None
    assert retry.link.starts_at == parent.terminated_at + timedelta(seconds=DELAY_S)
    # The first manager is gone; a new one, with nothing in memory, takes over.
    new_db = Database.open(database_url)
    try:
        restarted = SessionCoordinator(new_db, c.hints, c.events, clock=c.clock)
        c.coordinator = restarted
        c.controller = SessionController(new_db, c.hints, c.events, clock=c.clock)
        c.clock.advance(DELAY_S - 1)
        await c.settle()
        assert (await c.session(SessionId(retry.link.id))).status is S.PENDING
        schedule = await restarted.run_lifecycle(restarted.lifecycle[0])
        assert schedule.due_in_s is not None and 0 < schedule.due_in_s <= 1.1
        c.clock.advance(1.5)
        await c.settle()
    finally:
        await new_db.close()
    (_, done) = await read_chain(db, sid)
    assert (done.link.status, done.link.result) == (S.TERMINATED, "success")
    assert done.started_at is not None and done.started_at >= retry.link.starts_at


async def test_paused_retries_wait_and_are_decided_when_resumed(db: Database) -> None:
    """The admins' kill switch: while paused no retry is created; resuming creates it."""
    c, _ = await _failing_cluster(db, 1)
    await write_retry_switch(db, paused=True, reason="storm", by="admin", now=c.clock())
    sid = await c.submit(retry_policy=POLICY)
    await c.settle()
    chain = await read_chain(db, sid)
    assert [(a.link.status, a.link.retry_decision) for a in chain] == [(S.ERROR, None)]
    await write_retry_switch(db, paused=False, reason=None, by="admin", now=c.clock())
    await c.settle()
    assert [a.link.retry_decision for a in await read_chain(db, sid)] == ["scheduled", None]


async def test_group_and_cluster_defaults_give_a_session_its_policy(db: Database) -> None:
    """Precedence: the session's fields over its group's over the cluster's, merged."""
    from corral.domain.retry.policy import RetryPolicy
    from corral.store.resource_group_store import update_group

    c = await make_cluster(db, [CPU4])
    c.controller.retry_default = RetryPolicy(retry_delay=5, jitter="none")
    await update_group(db, "default", c.clock(), options_patch={"retry_policy": {"max_retries": 3}})
    plain = await c.submit()
    own = await c.submit(retry_policy={"backoff": "exponential"})
    interactive = await c.submit(type="INTERACTIVE", command=[])
    async with db.read() as conn:
        rows = {
            sid: (max_retries, policy)
            for sid, max_retries, policy in await conn.execute(
                sa.select(sessions.c.id, sessions.c.max_retries, sessions.c.retry_policy)
            )
        }
    assert rows[plain][0] == 3 and rows[plain][1]["retry_delay"] == 5
    assert rows[plain][1]["backoff"] == "fixed"
    assert rows[own][0] == 3 and rows[own][1]["backoff"] == "exponential"
    assert rows[interactive] == (0, None)


async def test_successes_are_decided_in_bulk_and_a_full_batch_is_due_again(db: Database) -> None:
    """Three successes and a failure, a batch of two: the first run decides two successes in
    one statement and says its batch was full; the next ones decide the third (a retry that
    recovered, counted) and schedule the failure's retry."""
    failing: set[SessionId] = set()
    c = await make_cluster(
        db,
        [CPU4],
        exit_code=lambda kernel: 1 if kernel.session_id in failing else 0,
        nonzero_exit_fails=True,
    )
    ok = [await c.submit(retry_policy=POLICY) for _ in range(3)]
    failing.add(await c.submit(retry_policy=POLICY))
    async with db.transaction() as conn:  # the third success as a retry that recovered
        await conn.execute(sessions.update().where(sessions.c.id == ok[2]).values(retry_count=1))
    # The sessions end while retries are paused: nothing is decided yet.
    await write_retry_switch(db, paused=True, reason="test", by="admin", now=c.clock())
    await c.settle()
    await write_retry_switch(db, paused=False, reason=None, by="admin", now=c.clock())
    dispatcher = c.coordinator.retries
    dispatcher.batch = 2
    first = await dispatcher.dispatch(c.clock())
    assert (first.looked_at, first.full, first.decided, first.recovered) == (2, True, (), 0)
    runs = [first]
    while runs[-1].full or runs[-1].looked_at:
        runs.append(await dispatcher.dispatch(c.clock()))
    assert sum(r.recovered for r in runs) == 1
    assert [v.decision for r in runs for _, v in r.decided] == [RetryDecision.SCHEDULED]
    async with db.read() as conn:
        decisions = dict(
            (await conn.execute(sa.select(sessions.c.id, sessions.c.retry_decision))).all()
        )
    assert {decisions[sid] for sid in ok} == {RetryDecision.SUCCEEDED.value}
    assert decisions[next(iter(failing))] == RetryDecision.SCHEDULED.value


async def test_without_a_policy_the_retry_task_only_reads(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ending wakes the retry task; where no session has a policy (the default), its run
    is one read, no write transaction (it was a write per burst of endings in every cluster)."""
    c = await make_cluster(db, [CPU4], exit_code=_exits(0))
    ended = [await c.submit() for _ in range(3)]
    await c.settle()
    async with db.read() as conn:
        statuses = (
            await conn.execute(sa.select(sessions.c.status).where(sessions.c.id.in_(ended)))
        ).scalars()
        assert set(statuses) == {S.TERMINATED.value}
    writes: list[object] = []
    real = Database.transaction

    def counted(self: Database, *args: Any, **kwargs: Any) -> Any:
        writes.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Database, "transaction", counted)
    done = await c.coordinator.retries.dispatch(c.clock())
    assert (done.looked_at, done.decided, done.children, writes) == (0, (), (), [])
    monkeypatch.undo()
    with_policy = await c.submit(retry_policy=POLICY)
    await c.settle()
    async with db.read() as conn:
        decided = await conn.scalar(
            sa.select(sessions.c.retry_decision).where(sessions.c.id == with_policy)
        )
    assert decided == RetryDecision.SUCCEEDED.value  # a policy's session is still decided
