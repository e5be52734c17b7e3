"""explain on SQLite and PostgreSQL: a read-only dry run that says where a session stands."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import timedelta
from typing import Any

import pytest

from corral.domain.status import SessionStatus
from corral.domain.types import ADMIN_ROLE, SessionId
from corral.scheduler.explain import SessionNotFoundError, explain
from corral.scheduler.planner import NO_CAPACITY, WAITING_BEHIND
from corral.scheduler.scheduler import schedule_group
from corral.scheduler.validators import DEPENDENCY_PENDING
from corral.store.agents import read_ledger
from corral.store.database import Database
from corral.store.placements import PHASE
from corral.store.sessions import SessionRepository
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_dependent,
    add_session_ids,
    add_sessions,
    add_user,
    history_rows,
    number_of,
    update_sessions,
)

S = SessionStatus
LATER = NOW + timedelta(minutes=1)


async def footprint(db: Database, ids: Collection[SessionId]) -> tuple[Any, ...]:
    """Everything a pass would write: session and kernel states, the ledger, history."""
    found = await SessionRepository(db).get(ids)
    states = sorted(
        (s.id, s.status, tuple((k.status, k.agent_id, k.occupied_slots) for k in s.kernels))
        for s in found
    )
    return states, await read_ledger(db), await history_rows(db, PHASE)


async def test_session_that_fits_is_explained_as_placed(db: Database) -> None:
    """A session that fits now is `placed` at its position, and explaining it places nothing."""
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    await add_agents(db, [{"cpu": 4000}])
    first, second = await add_session_ids(db, owner, 2)
    await update_sessions(db, [first], priority=1)
    before = await footprint(db, [first, second])

    explained = await explain(db, first, LATER)

    assert (explained.outcome, explained.code) == ("placed", "")
    assert (explained.position, explained.queue_length) == (1, 2)
    assert (explained.status, explained.resource_group) == (S.PENDING, "default")
    assert "fits now" in explained.message
    assert (await explain(db, second, LATER)).position == 2
    assert await footprint(db, [first, second]) == before
    assert first in (await schedule_group(db, "default", LATER)).committed.placed


async def test_session_behind_a_large_head_is_blocked_and_names_it(db: Database) -> None:
    """Under strict ordering a small session is `blocked`, naming the head that does not fit."""
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    await add_agents(db, [{"cpu": 4000}])
    [holder] = await add_session_ids(db, owner, 1)
    assert (await schedule_group(db, "default", NOW)).committed.placed == [holder]
    head, small = await add_sessions(db, owner, [(1, {"cpu": 4000}), (1, {"cpu": 1000})])
    await update_sessions(db, [head.id], priority=1)
    ids = [holder, head.id, small.id]
    before = await footprint(db, ids)

    blocked = await explain(db, small.id, LATER)
    waiting = await explain(db, head.id, LATER)

    assert (blocked.outcome, blocked.code) == ("blocked", WAITING_BEHIND)
    assert (blocked.position, blocked.queue_length) == (2, 2)
    assert str(head.id)[:8] in blocked.message
    assert (waiting.outcome, waiting.code) == ("waiting", NO_CAPACITY)
    assert (waiting.position, waiting.queue_length) == (1, 2)
    assert await footprint(db, ids) == before


async def test_session_waiting_for_a_dependency_says_which(db: Database) -> None:
    """A session whose dependency has not ended is `waiting` with code dependency_pending."""
    owner = await add_user(db, ADMIN_ROLE)  # sessions above max_user_priority
    await add_agents(db, [{"cpu": 4000}])
    [dependency] = await add_session_ids(db, owner, 1)
    dependant = await add_dependent(db, owner, [dependency])
    await update_sessions(db, [dependency], priority=1)
    before = await footprint(db, [dependency, dependant])

    explained = await explain(db, dependant, LATER)

    assert (explained.outcome, explained.code) == ("waiting", DEPENDENCY_PENDING)
    assert (explained.position, explained.queue_length) == (2, 2)
    assert f"session {await number_of(db, dependency)}" in explained.message
    assert await footprint(db, [dependency, dependant]) == before


@pytest.mark.parametrize(
    ("column", "value", "code"),
    [
        ("starts_at", LATER + timedelta(seconds=1), "starts_at"),
        ("requeue_at", LATER + timedelta(seconds=1), "requeue_at"),
        ("requeue_active", False, "deactivated"),
    ],
)
async def test_session_not_yet_due_is_explained_as_not_due(
    db: Database, column: str, value: object, code: str
) -> None:
    """A future starts_at or requeue_at, or a deactivated session, is `not_due` with no position."""
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 4000}])
    [session, other] = await add_session_ids(db, owner, 2)
    await update_sessions(db, [session], **{column: value})
    before = await footprint(db, [session, other])

    explained = await explain(db, session, LATER)

    assert (explained.outcome, explained.code) == ("not_due", code)
    assert (explained.position, explained.queue_length) == (None, 0)
    assert explained.status is S.PENDING
    assert await footprint(db, [session, other]) == before


async def test_session_already_placed_is_explained_as_not_pending(db: Database) -> None:
    """A session no longer PENDING is `not_pending` and reports its status."""
    owner = await add_user(db)
    await add_agents(db, [{"cpu": 4000}])
    [session] = await add_session_ids(db, owner, 1)
    assert (await schedule_group(db, "default", NOW)).committed.placed == [session]
    before = await footprint(db, [session])

    explained = await explain(db, session, LATER)

    assert explained.outcome == "not_pending" and explained.status is S.SCHEDULED
    assert (explained.position, explained.queue_length) == (None, 0)
    assert "SCHEDULED" in explained.message
    assert explained.as_json()["status"] == "SCHEDULED"
    assert await footprint(db, [session]) == before


async def test_unknown_session_raises_not_found(db: Database) -> None:
    """Explaining an id no session has raises SessionNotFoundError."""
    missing = uuid.uuid4()
    with pytest.raises(SessionNotFoundError, match=str(missing)):
        await explain(db, missing, LATER)
