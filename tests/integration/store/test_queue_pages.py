"""A group's queue read a page at a time (`read_queue_page`), on SQLite and PostgreSQL: in
the sequencers' order, and no further than the group's free slots let a pass go."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from corral.domain.resource_group import Sequencer
from corral.domain.session import PendingSession, SessionWithKernels
from corral.domain.types import SessionId
from corral.scheduler.sequencers import order_sessions
from corral.store.database import Database
from corral.store.scheduling import QueuePlace, read_pending_groups, read_queue_page
from tests.integration.store._factories import (
    NOW,
    add_group,
    add_session_ids,
    add_user,
    update_sessions,
)


async def queue(db: Database, count: int, seed: int, *, evicted: bool = False) -> list[SessionId]:
    """`count` PENDING sessions in `default` with priorities 0..2 and only three distinct
    creation times, so that most ties are broken by id. With `evicted`, about a third were
    evicted, at one of three times that fall among and after the creation times."""
    rng = random.Random(seed)
    ids = await add_session_ids(db, await add_user(db), count)
    for sid in ids:
        await update_sessions(
            db,
            [sid],
            priority=rng.randint(0, 2),
            created_at=NOW - timedelta(seconds=rng.randint(0, 2)),
            evicted_at=(
                NOW - timedelta(seconds=rng.randint(-1, 1))
                if evicted and rng.random() < 0.35
                else None
            ),
        )
    return ids


def in_queue_order(
    page: list[SessionWithKernels], newest: bool, by_eviction: bool = False
) -> list[SessionId]:
    """The sessions as the FIFO (LIFO) sequencer orders them, evicted ones by their eviction
    with `by_eviction` (what a pass's planner does with the page)."""
    sequencer = Sequencer.LIFO if newest else Sequencer.FIFO
    pending = [PendingSession.of(s) for s in page]
    ordered = order_sessions(
        pending, sequencer, usage={}, group_capacity={}, by_eviction=by_eviction
    )
    return [s.id for s in ordered]


async def read_all(
    db: Database, *, newest: bool, size: int | None, by_eviction: bool = False
) -> list[SessionWithKernels]:
    """Every page in turn, each after the last session of the one before, as a pass reads."""
    pages: list[SessionWithKernels] = []
    after: QueuePlace | None = None
    for _ in range(64):  # more pages than a 30-session queue has: the keyset is broken
        async with db.read_statements() as conn:
            read = await read_queue_page(
                conn,
                db.dialect,
                "default",
                NOW,
                newest_first=newest,
                limit=size,
                by_eviction=by_eviction,
                after=after,
            )
        page = read.sessions
        pages.extend(page)
        if not read.more:
            assert size is None or len(page) < size or len(pages) == 30
            return pages
        assert size is not None and len(page) == size
        last = in_queue_order(page, newest, by_eviction)[-1]
        session = next(s for s in page if s.id == last)
        after = QueuePlace.of(session, by_eviction=by_eviction)
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize("newest", [False, True], ids=["fifo", "lifo"])
@pytest.mark.parametrize("size", [1, 4, 7, 30])
async def test_pages_cover_the_queue_once_in_the_sequencers_order(
    db: Database, newest: bool, size: int
) -> None:
    """Page after page gives every candidate exactly once, pages in the order the FIFO (LIFO)
    sequencer sorts the whole queue: the SQL order and the Python one agree, ties included."""
    await queue(db, 30, seed=size)
    whole = await read_all(db, newest=newest, size=None)
    assert len(whole) == 30
    expected = in_queue_order(whole, newest)
    paged = await read_all(db, newest=newest, size=size)
    ids = [s.id for s in paged]
    assert len(ids) == len(set(ids)) == 30
    for start in range(0, 30, size):  # each page holds the next `size` of the queue
        assert set(ids[start : start + size]) == set(expected[start : start + size])


@pytest.mark.parametrize("newest", [False, True], ids=["fifo", "lifo"])
@pytest.mark.parametrize("size", [1, 4, 7, 30])
async def test_pages_place_evicted_sessions_by_their_eviction(
    db: Database, newest: bool, size: int
) -> None:
    """A group whose evicted sessions take their place by their last eviction (spec document
    2's `requeuing.timestamp` = `eviction`) is read in pages too: every candidate once, each
    page the next part of the order the sequencer gives the whole queue with eviction times;
    and that order is not the order by creation (the case is not vacuous)."""
    await queue(db, 30, seed=100 + size, evicted=True)
    whole = await read_all(db, newest=newest, size=None)
    assert sum(s.evicted_at is not None for s in whole) >= 5
    expected = in_queue_order(whole, newest, by_eviction=True)
    assert expected != in_queue_order(whole, newest)
    paged = await read_all(db, newest=newest, size=size, by_eviction=True)
    ids = [s.id for s in paged]
    assert len(ids) == len(set(ids)) == 30
    for start in range(0, 30, size):
        assert set(ids[start : start + size]) == set(expected[start : start + size])


async def test_a_page_holds_only_candidates_of_its_group(db: Database) -> None:
    """Not yet due, deactivated, other groups' and no longer PENDING sessions are left out."""
    owner = await add_user(db)
    await add_group(db, "other")
    due, later, inactive, placed = await add_session_ids(db, owner, 4)
    (elsewhere,) = await add_session_ids(db, owner, 1, group="other")
    await update_sessions(db, [later], starts_at=NOW + timedelta(minutes=5))
    await update_sessions(db, [inactive], requeue_active=False)
    await update_sessions(db, [placed], status="SCHEDULED")
    async with db.read_statements() as conn:
        read = await read_queue_page(conn, db.dialect, "default", NOW, newest_first=False, limit=10)
        assert await read_pending_groups(conn) == ["default", "other"]
    page = read.sessions
    assert [s.id for s in page] == [due]
    assert not read.more
    assert [len(s.kernels) for s in page] == [1]
    await update_sessions(db, [elsewhere], status="CANCELLED")
    async with db.read_statements() as conn:
        assert await read_pending_groups(conn) == ["default"]


async def read_first_page(
    db: Database, free: dict[str, int], limit: int = 10, at_least: int = 0
) -> tuple[list[SessionId], bool]:
    async with db.read_statements() as conn:
        read = await read_queue_page(
            conn,
            db.dialect,
            "default",
            NOW,
            newest_first=False,
            limit=limit,
            free=free,
            at_least=at_least,
        )
    return sorted(s.id for s in read.sessions), read.more


async def test_a_page_ends_at_the_first_session_the_free_slots_cannot_also_hold(
    db: Database,
) -> None:
    """Sessions of 1 and 2 cpu (2 kernels of 1), 4.5 cpu free: the first three demand 4, the
    fourth would make 5, so no strict pass gets past it. The page holds those four (the fourth
    to be judged), says more may follow, and the sessions behind are not read."""
    owner = await add_user(db)
    one, two = (
        (await add_session_ids(db, owner, 1)),
        (await add_session_ids(db, owner, 1, cluster_size=2)),
    )
    rest = await add_session_ids(db, owner, 5)
    ids = [*one, *two, *rest]
    for index, sid in enumerate(ids):  # queue order: the order they were listed
        await update_sessions(db, [sid], created_at=NOW - timedelta(seconds=60 - index))
    assert await read_first_page(db, {"cpu": 4500, "mem": 0}) == (sorted(ids[:4]), True)
    # Exactly enough for all of them: nothing overflows, the page is the whole queue.
    assert await read_first_page(db, {"cpu": 8000}) == (sorted(ids), False)
    # Nothing free: the head of the queue alone, to be judged; or as many as asked at least.
    assert await read_first_page(db, {"cpu": 0}) == (sorted(ids[:1]), True)
    assert await read_first_page(db, {"cpu": 0}, at_least=5) == (sorted(ids[:5]), True)
    assert await read_first_page(db, {"cpu": 0}, at_least=50) == (sorted(ids), False)
    # A slot the group does not offer at all overflows at once, as nothing free does.
    await update_sessions(db, [ids[0]], kernel_slots={"cpu": 1000, "cuda.device": 1000})
    assert await read_first_page(db, {"cpu": 9000}) == (sorted(ids[:1]), True)


async def test_a_session_of_unlike_kernels_counts_as_demanding_nothing(db: Database) -> None:
    """Without per-kernel slots on the session row its demand is not known from the page's
    columns: the bound skips it (it may only read further), and counts the rest."""
    owner = await add_user(db)
    ids = await add_session_ids(db, owner, 4)
    for index, sid in enumerate(ids):
        await update_sessions(db, [sid], created_at=NOW - timedelta(seconds=60 - index))
    await update_sessions(db, ids[:2], kernel_slots=None)
    assert await read_first_page(db, {"cpu": 1000}) == (sorted(ids), False)
    assert await read_first_page(db, {"cpu": 500}) == (sorted(ids[:3]), True)


async def test_a_full_page_says_more_may_follow(db: Database) -> None:
    """A page as long as the limit cannot know the queue ended: `more`, then an empty page."""
    ids = await add_session_ids(db, await add_user(db), 3)
    assert await read_first_page(db, {"cpu": 10_000}, limit=3) == (sorted(ids), True)
