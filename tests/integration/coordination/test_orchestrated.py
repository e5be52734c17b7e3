"""Managers run by their orchestrators: real dual loops, hint buses, locks and a test agent."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
import sqlalchemy as sa
from redis.asyncio import Redis

from corral.bench._scratch import StatementCounter
from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.loop import DualLoop
from corral.coordination.manager import LoopIntervals, session_orchestrator
from corral.coordination.orchestrator import Orchestrator
from corral.domain.spec import SessionSpec
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.infra.hints import HintBus, HintBusKind, open_hint_bus
from corral.infra.hints.memory import MemoryHintBus
from corral.infra.locks import Hold, LockManager, open_lock_manager
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.tables import kernel_history, kernels, session_history, sessions
from corral.testing.agent import TestAgent
from tests.integration.coordination._harness import LIFECYCLE, Clock
from tests.integration.store._factories import add_agents, add_user

S = SessionStatus
SETTLE_DEADLINE_S = 90.0  # generous: a loaded 2-core machine; a healthy run takes seconds
POLL_S = 0.02
AGENT_INTERVAL_S = 0.05  # the test agent's wait for a hint (with hints lost, its period)


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = 30.0,
    *,
    watch: Collection[asyncio.Task[None]] = (),
) -> None:
    """Return once `predicate()` (awaited if need be) is True; fail after `timeout_s`.

    A task in `watch` that ends first fails the wait at once with its own error.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = predicate()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome is True:
            return
        for task in watch:
            if task.done():
                task.result()
                raise AssertionError(f"{task.get_name()} ended while waiting")
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {predicate!r}")
        await asyncio.sleep(POLL_S)  # the poll interval, not a wait for an outcome


class LostHints(HintBus):
    """A memory hint bus that loses every set(): nothing is ever woken or consumed."""

    def __init__(self) -> None:
        self._bus = MemoryHintBus()
        self.lost = 0  # names set() dropped
        self.consumed = 0  # consume() calls that won a hint

    async def set(self, *names: str) -> None:
        self.lost += len(names)

    async def consume(self, name: str) -> bool:
        won = await self._bus.consume(name)
        self.consumed += won
        return won

    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        return await self._bus.wait(names, timeout_s)

    async def close(self) -> None:
        await self._bus.close()


async def finish_jobs(agent: TestAgent, stop: asyncio.Event) -> None:
    """Until `stop`: the main kernel of a RUNNING session exits 0 (its job is done).

    Sub kernels run on until their session stops them. Ending kernels only once the session
    is RUNNING, in a report of their own, keeps every session's path and result deterministic:
    a kernel exiting in its start report lets DetectTermination overtake PromoteToRunning.
    """
    k = kernels.c
    running_mains = (
        sa.select(k.id)
        .join(sessions, sessions.c.id == k.session_id)
        .where(
            sessions.c.status == S.RUNNING.value,
            k.cluster_role == "main",
            k.status == KernelStatus.RUNNING.value,
        )
    )
    while not stop.is_set():
        async with agent.db.read() as conn:
            ids = list((await conn.execute(running_mains)).scalars())
        if ids:
            await agent.exit(ids, exit_code=0)
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), AGENT_INTERVAL_S)


@asynccontextmanager
async def agents_running(agent: TestAgent) -> AsyncIterator[list[asyncio.Task[None]]]:
    """`agent.run` and `finish_jobs` in the background until the block ends; errors re-raised."""
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(agent.run(stop, interval_s=AGENT_INTERVAL_S), name="test-agent"),
        asyncio.create_task(finish_jobs(agent, stop), name="finish-jobs"),
    ]
    try:
        yield tasks
    finally:
        stop.set()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome


def batch_spec(cluster_size: int = 1) -> SessionSpec:
    """A one-cpu-per-kernel batch session; multi-node when `cluster_size` > 1."""
    return SessionSpec.model_validate(
        {
            "image": "python",
            "command": ["true"],
            "resources": {"cpu": "1"},
            "cluster_mode": "multi-node" if cluster_size > 1 else "single-node",
            "cluster_size": cluster_size,
        }
    )


async def outcomes(db: Database) -> dict[SessionId, tuple[str, str | None]]:
    """(status, result) of every session."""
    c = sessions.c
    async with db.read() as conn:
        rows = await conn.execute(sa.select(c.id, c.status, c.result))
        return {SessionId(sid): (status, result) for sid, status, result in rows}


@dataclass
class AllTerminated:
    """A predicate: `count` sessions exist and all are TERMINATED; its repr shows the last look."""

    db: Database
    count: int
    seen: Counter[str] = field(default_factory=Counter)

    async def __call__(self) -> bool:
        self.seen = Counter(status for status, _ in (await outcomes(self.db)).values())
        return self.seen == {S.TERMINATED.value: self.count}

    def __repr__(self) -> str:
        return f"all {self.count} sessions TERMINATED (last seen: {dict(self.seen)})"


def total_runs(loops: Iterable[DualLoop]) -> int:
    return sum(loop.runs for loop in loops)


async def test_lifecycles_complete_through_the_long_loop_with_every_hint_lost(
    db: Database, namespace: str
) -> None:
    """With every hint lost, forced long-loop runs alone carry sessions to a successful end."""
    hints, clock = LostHints(), Clock()
    agents = await add_agents(db, [{"cpu": 2000}] * 3)
    owner = await add_user(db)
    controller = SessionController(db, hints, clock=clock)
    coordinator = SessionCoordinator(db, hints, clock=clock)
    agent = TestAgent(db, list(agents), hints=hints, clock=clock)
    locks = await open_lock_manager("memory", prefix=namespace)
    intervals = LoopIntervals(short_interval_s=0.05, long_interval_s=0.1)
    orchestrator = session_orchestrator(coordinator, hints, locks, intervals=intervals)
    try:
        async with orchestrator, agents_running(agent) as agent_tasks:
            for size in (1, 2, 1, 1, 1):
                await controller.enqueue(batch_spec(size), owner)
            await eventually(AllTerminated(db, 5), SETTLE_DEADLINE_S, watch=agent_tasks)
    finally:
        await locks.close()
        await hints.close()
    assert {result for _, result in (await outcomes(db)).values()} == {"success"}
    assert hints.lost > 0 and hints.consumed == 0
    for loop in orchestrator.loops:
        assert loop.wakes == 0, loop.task.name
        assert loop.forced_runs > 0, loop.task.name
        assert loop.runs == loop.forced_runs, loop.task.name  # no run came from a hint


@dataclass
class Manager:
    """One manager process: its own pool, hint bus, locks, controller and running loops."""

    controller: SessionController
    orchestrator: Orchestrator


async def open_database(stack: AsyncExitStack, url: str) -> Database:
    db = Database.open(url, pool_size=5)
    stack.push_async_callback(db.close)
    return db


async def open_hints(
    stack: AsyncExitStack, kind: HintBusKind, namespace: str, db: Database, redis_url: str | None
) -> HintBus:
    hints = await open_hint_bus(kind, prefix=namespace, db=db, redis_url=redis_url)
    stack.push_async_callback(hints.close)
    return hints


async def start_manager(
    stack: AsyncExitStack,
    url: str,
    kind: HintBusKind,
    namespace: str,
    redis_url: str | None,
    *,
    long_interval_s: float = 0.5,
) -> Manager:
    """A manager on its own Database of `url`, with hints and locks on `kind`, loops running."""
    db = await open_database(stack, url)
    hints = await open_hints(stack, kind, namespace, db, redis_url)
    locks = await open_lock_manager(
        kind, prefix=namespace, postgres_dsn=url, redis_url=redis_url, ttl_s=1.0
    )
    stack.push_async_callback(locks.close)
    clock = Clock()
    coordinator = SessionCoordinator(db, hints, clock=clock)
    intervals = LoopIntervals(short_interval_s=0.02, long_interval_s=long_interval_s)
    orchestrator = session_orchestrator(coordinator, hints, locks, intervals=intervals)
    await stack.enter_async_context(orchestrator)
    return Manager(SessionController(db, hints, clock=clock), orchestrator)


@pytest.fixture(params=["postgres", pytest.param("redis", marks=pytest.mark.redis)])
def shared_backend(request: pytest.FixtureRequest) -> tuple[HintBusKind, str | None]:
    """Where the managers share hints and locks, and the Redis URL when that is Redis."""
    if request.param == "redis":
        return "redis", request.getfixturevalue("redis_url")
    return "postgres", None


async def delete_redis_keys(redis_url: str, namespace: str) -> None:
    client = Redis.from_url(redis_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{namespace}*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.mark.postgres
async def test_two_orchestrators_share_postgres_without_double_transitions(
    postgres_database_url: str,
    shared_backend: tuple[HintBusKind, str | None],
    namespace: str,
) -> None:
    """Two managers sharing one database move each session into each status once, in order."""
    kind, redis_url = shared_backend
    url = postgres_database_url
    async with AsyncExitStack() as stack:
        if redis_url is not None:
            stack.push_async_callback(delete_redis_keys, redis_url, namespace)
        agent_db = await open_database(stack, url)
        agents = await add_agents(agent_db, [{"cpu": 2000}] * 4)
        owner = await add_user(agent_db)
        agent_hints = await open_hints(stack, kind, namespace, agent_db, redis_url)
        agent = TestAgent(agent_db, list(agents), hints=agent_hints)
        managers = [await start_manager(stack, url, kind, namespace, redis_url) for _ in range(2)]
        agent_tasks = await stack.enter_async_context(agents_running(agent))
        count = 40
        for i in range(count):
            spec = batch_spec(cluster_size=2 if i % 4 == 3 else 1)
            await managers[i % 2].controller.enqueue(spec, owner)
        await eventually(AllTerminated(agent_db, count), SETTLE_DEADLINE_S, watch=agent_tasks)
    db = Database.open(url, pool_size=1)
    try:
        assert {result for _, result in (await outcomes(db)).values()} == {"success"}
        await assert_each_move_recorded_once(db, count)
        ledger = await read_ledger(db)
    finally:
        await db.close()
    occupied = {(a, slot): used for a, slots in ledger.items() for slot, (_, used) in slots.items()}
    assert set(occupied.values()) == {0}, occupied
    for manager in managers:
        # Each took part: it ran tasks, or found them held by the other (a busy holder keeps
        # its locks while hints keep coming, so under load one manager may run nothing).
        loops = manager.orchestrator.loops
        assert total_runs(loops) + sum(loop.lock_busy for loop in loops) > 0


async def assert_each_move_recorded_once(db: Database, count: int) -> None:
    """Every session walked the lifecycle once; no kernel made one move twice."""
    sh, kh = session_history.c, kernel_history.c
    async with db.read() as conn:
        session_rows = (
            await conn.execute(
                sa.select(sh.session_id, sh.from_status, sh.to_status).order_by(sh.id)
            )
        ).all()
        kernel_rows = (
            await conn.execute(sa.select(kh.kernel_id, kh.from_status, kh.to_status))
        ).all()
    moves = [(sid, before, after) for sid, before, after in session_rows if before != after]
    doubled = [k for k, n in Counter((sid, after) for sid, _, after in moves).items() if n > 1]
    assert not doubled, f"sessions moved into one status twice: {doubled}"
    walked: defaultdict[SessionId, list[tuple[str, str]]] = defaultdict(list)
    for sid, before, after in moves:
        walked[sid].append((before, after))
    expected = list(pairwise(s.value for s in LIFECYCLE))
    wrong = {sid: path for sid, path in walked.items() if path != expected}
    assert not wrong, f"sessions off the lifecycle: {wrong}"
    assert len(walked) == count
    repeated = [k for k, n in Counter(map(tuple, kernel_rows)).items() if n > 1]
    assert not repeated, f"kernels with a repeated (from, to) history row: {repeated}"


class CountingLocks(LockManager):
    """A lock manager that counts how often a lock was asked for, and how many are held."""

    def __init__(self, inner: LockManager) -> None:
        self.inner = inner
        self.holds = 0
        self.held = 0  # holds entered and not yet left

    def hold(self, name: str) -> AbstractAsyncContextManager[Hold]:
        self.holds += 1
        return self._counted(name)

    @asynccontextmanager
    async def _counted(self, name: str) -> AsyncIterator[Hold]:
        async with self.inner.hold(name) as held:
            self.held += 1
            try:
                yield held
            finally:
                self.held -= 1

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize(
    ("database_url", "hint_kind"),
    [
        ("sqlite", "memory"),
        pytest.param("postgresql", "memory", marks=pytest.mark.postgres),
        pytest.param("postgresql", "postgres", marks=pytest.mark.postgres),
    ],
    indirect=["database_url"],
)
async def test_an_idle_manager_makes_no_database_queries_between_long_loops(
    db: Database, hint_kind: HintBusKind, namespace: str
) -> None:
    """With nothing hinted, the short loops tick on the hint bus alone: no SQL statement at all.
    On a lossless (in-process) bus they do not tick: nothing at all happens between the runs at
    start and the long loop."""
    hints = await open_hint_bus(hint_kind, prefix=namespace, db=db)
    # Counted, so the test also pins that an idle tick takes no lock (a PostgreSQL or Redis lock
    # would be a query on the lock manager's own connection, which the counter below misses).
    locks = CountingLocks(await open_lock_manager("memory", prefix=namespace))
    intervals = LoopIntervals(short_interval_s=0.01, long_interval_s=3600.0)
    orchestrator = session_orchestrator(
        SessionCoordinator(db, hints), hints, locks, intervals=intervals
    )
    loops = orchestrator.loops
    try:
        async with orchestrator:
            # Start-up queries: a fresh PostgreSQL bus checks every hint's row once, and every
            # task runs once (a restarted manager owes each task a run), found nothing, and
            # gave its lock back (no linger after a run that found nothing).
            await eventually(lambda: all(loop.runs == 1 for loop in loops))
            await eventually(lambda: locks.held == 0)
            counter = StatementCounter(db)
            holds = locks.holds
            started = [loop.attempts for loop in loops]
            if hints.lossless:
                # Nothing to wait for: a window in which nothing may happen.
                await asyncio.sleep(0.5)
                assert [loop.attempts for loop in loops] == started
            else:
                await eventually(
                    lambda: all(
                        loop.attempts >= n + 20 for loop, n in zip(loops, started, strict=True)
                    )
                )
            statements = counter.count
            idle_holds = locks.holds - holds
    finally:
        await locks.close()
        await hints.close()
    assert statements == 0
    assert idle_holds == 0
    # The run at start, then nothing: the long loop never came round.
    assert total_runs(loops) == len(loops)
