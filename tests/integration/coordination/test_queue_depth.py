"""A scheduling pass reads its queue a page at a time and stops where the queue is blocked;
a page ends where the group's free slots run out."""

from __future__ import annotations

import pytest

from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.tasks import TaskRun
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.scheduler import snapshot
from corral.store.database import Database
from tests.integration.coordination._harness import Cluster, make_cluster
from tests.integration.store._factories import set_group_options, update_sessions

S = SessionStatus
PAGE = 3


async def paged_cluster(db: Database, cpu: int) -> Cluster:
    """One agent with `cpu` cores, and a coordinator whose passes read pages of PAGE."""
    c = await make_cluster(db, [{"cpu": cpu * 1000}])
    c.coordinator = SessionCoordinator(db, c.hints, c.events, clock=c.clock, queue_page=PAGE)
    return c


async def submit_in_turn(c: Cluster, count: int) -> list[SessionId]:
    """`count` sessions submitted a second apart: the queue holds them in this order."""
    ids = []
    for _ in range(count):
        c.clock.advance(1)
        ids.append(await c.submit())
    return ids


async def schedule(c: Cluster) -> TaskRun:
    (task,) = [t for t in c.coordinator.tasks() if t.name == "ScheduleNewSessions"]
    return await task.run()


async def notes(c: Cluster, ids: list[SessionId]) -> list[str | None]:
    return [(await c.session(sid)).status_info for sid in ids]


async def test_a_pass_on_a_full_cluster_reads_one_page(db: Database) -> None:
    """The first session waits for capacity, so everything after it waits behind it: the pass
    judges one page and leaves the rest of the queue as it was (no note, no history)."""
    c = await paged_cluster(db, cpu=1)
    holder = await c.submit()
    assert (await schedule(c)).changed == 1
    queued = await submit_in_turn(c, 10)
    before = [len(await c.moves_of(sid)) for sid in queued]

    run = await schedule(c)

    assert (run.targets, run.changed) == (PAGE, 0)
    assert await c.status(holder) is S.PREPARING
    assert {await c.status(sid) for sid in queued} == {S.PENDING}
    judged = await notes(c, queued[:PAGE])
    assert judged[0] is not None and "no agent has room" in judged[0]
    assert all(n is not None and "waiting behind" in n for n in judged[1:])
    assert await notes(c, queued[PAGE:]) == [None] * (10 - PAGE)
    after = [len(await c.moves_of(sid)) for sid in queued]
    assert after[PAGE:] == before[PAGE:]
    assert all(a > b for a, b in zip(after[:PAGE], before[:PAGE], strict=True))


async def test_free_capacity_is_filled_across_pages_in_queue_order(db: Database) -> None:
    """Five free cores, ten one-core sessions of mixed priority: one pass reads pages until the
    sixth session in queue order waits, and places exactly the first five."""
    c = await paged_cluster(db, cpu=5)
    await set_group_options(db, "default", {"max_user_priority": 2})
    queued = [await c.submit() for _ in range(10)]
    priority = dict(zip(queued, [0, 2, 0, 1, 2, 0, 1, 0, 2, 1], strict=True))
    for sid, level in priority.items():
        await update_sessions(db, [sid], priority=level)
    # Priority first, then age: every `submit` here comes at the same instant, so ties go by
    # id, as the sequencer breaks them.
    by_queue = sorted(queued, key=lambda sid: (-priority[sid], sid))

    run = await schedule(c)

    placed = [sid for sid in queued if await c.status(sid) is S.PREPARING]
    assert sorted(placed) == sorted(by_queue[:5])
    assert run.changed == 5
    assert run.targets == 6  # pages of 3: 3 placed; then 2 placed and the sixth blocks
    assert (await c.session(by_queue[5])).status_info is not None
    assert await notes(c, by_queue[6:]) == [None] * 4


async def test_a_pending_timeout_reaches_beyond_the_page(db: Database) -> None:
    """Sessions past the page that waited longer than the group's PENDING timeout are
    cancelled like the others: the coordinator reads the expiring ones itself."""
    c = await paged_cluster(db, cpu=1)
    await c.submit()
    await schedule(c)
    await set_group_options(
        db, "default", {"phase_limits": {"ScheduleNewSessions": {"timeout_s": 60}}}
    )
    queued = [await c.submit() for _ in range(10)]
    c.clock.advance(61)

    run = await schedule(c)

    assert run.changed == 10
    assert {await c.status(sid) for sid in queued} == {S.CANCELLED}


@pytest.mark.parametrize(
    "options", [{"ordering": "best_effort"}, {"sequencer": "drf"}], ids=["best-effort", "drf"]
)
async def test_a_group_whose_order_needs_the_whole_queue_reads_it_whole(
    db: Database, options: dict[str, str]
) -> None:
    """Best-effort ordering lets later sessions pass a waiting one, and DRF orders by what
    every owner holds: such a pass reads every pending session of the group."""
    c = await paged_cluster(db, cpu=1)
    await set_group_options(db, "default", options)
    await c.submit()
    await schedule(c)
    queued = [await c.submit() for _ in range(10)]

    run = await schedule(c)

    assert run.targets == 10
    assert None not in await notes(c, queued)


async def test_a_blocked_queue_moves_on_as_capacity_frees(db: Database) -> None:
    """The queue behind the page is not forgotten: as sessions end, later passes reach it."""
    c = await paged_cluster(db, cpu=1)
    queued = await submit_in_turn(c, 2 * PAGE + 1)
    for step, sid in enumerate(queued):
        await c.settle()
        assert await c.status(sid) is S.RUNNING, step
        running = await c.session(sid)
        await c.agent.exit([k.id for k in running.kernels], exit_code=0)
    await c.settle()
    assert {await c.status(sid) for sid in queued} == {S.TERMINATED}


async def bounded_cluster(
    db: Database, cpu: int, monkeypatch: pytest.MonkeyPatch, page: int = 10
) -> Cluster:
    """As `paged_cluster` with pages of `page`, each ending where the free cores run out
    (no floor of sessions per page)."""
    monkeypatch.setattr(snapshot, "PAGE_AT_LEAST", 1)
    c = await make_cluster(db, [{"cpu": cpu * 1000}])
    c.coordinator = SessionCoordinator(db, c.hints, c.events, clock=c.clock, queue_page=page)
    return c


async def test_a_page_ends_where_the_free_slots_run_out(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One core free, ten one-core sessions queued: the pass reads the first two of its page
    of ten (one placed, the second waits for capacity) and leaves the rest unread."""
    c = await bounded_cluster(db, cpu=2, monkeypatch=monkeypatch)
    holder = await c.submit()
    assert (await schedule(c)).changed == 1
    queued = await submit_in_turn(c, 10)

    run = await schedule(c)

    assert (run.targets, run.changed) == (2, 1)
    assert await c.status(holder) is S.PREPARING
    assert await c.status(queued[0]) is S.PREPARING
    [waits] = await notes(c, queued[1:2])
    assert waits is not None and "no agent has room" in waits
    assert await notes(c, queued[2:]) == [None] * 8


async def test_sessions_that_take_no_capacity_let_the_pass_read_on(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three sessions too large for any agent head the queue: each ends a page (it alone
    demands more than is free), fails, and blocks nothing, so the same pass reads on, page
    after page, and places the two small sessions behind them; the third waits."""
    c = await bounded_cluster(db, cpu=2, monkeypatch=monkeypatch)
    c.clock.advance(1)
    too_large = [await c.submit(resources={"cpu": "8"}) for _ in range(3)]
    small = await submit_in_turn(c, 3)

    run = await schedule(c)

    assert {await c.status(sid) for sid in too_large} == {S.CANCELLED}
    assert [await c.status(sid) for sid in small] == [S.PREPARING, S.PREPARING, S.PENDING]
    assert run.targets == 6


async def test_a_pass_reads_a_few_more_than_fit_not_a_whole_floor(db: Database) -> None:
    """One core frees up with a hundred one-core sessions queued: the pass reads its first
    page's floor (PAGE_AT_LEAST_FIRST), places one and notes the others read as waiting; the
    rest of the queue is not read, so not noted."""
    c = await make_cluster(db, [{"cpu": 1000}])
    queued = await submit_in_turn(c, 100)

    run = await schedule(c)

    assert (run.targets, run.changed) == (snapshot.PAGE_AT_LEAST_FIRST, 1)
    assert await c.status(queued[0]) is S.PREPARING
    read = await notes(c, queued[1 : snapshot.PAGE_AT_LEAST_FIRST])
    assert all(n is not None and ("no agent has room" in n or "waiting behind" in n) for n in read)
    assert await notes(c, queued[snapshot.PAGE_AT_LEAST_FIRST :]) == [None] * (
        100 - snapshot.PAGE_AT_LEAST_FIRST
    )


async def test_a_head_waiting_for_a_dependency_is_read_past_in_growing_pages(
    db: Database,
) -> None:
    """Fifty sessions at the head wait for one that runs, and one core is free: they take
    nothing, so the pass reads on, each page holding at least twice as many as the one before
    (16, 32, 64), and places the first session behind them in the third."""
    c = await make_cluster(db, [{"cpu": 2000}])
    first = await c.submit()
    assert (await schedule(c)).changed == 1
    waiting = [await c.submit(dependencies=[str(first)]) for _ in range(50)]
    c.clock.advance(1)
    behind = await submit_in_turn(c, 100)

    run = await schedule(c)

    assert {await c.status(sid) for sid in waiting} == {S.PENDING}
    assert await c.status(behind[0]) is S.PREPARING
    assert {await c.status(sid) for sid in behind[1:]} == {S.PENDING}
    floor = snapshot.PAGE_AT_LEAST_FIRST
    assert run.targets == floor + 2 * floor + 4 * floor
