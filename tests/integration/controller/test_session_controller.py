"""SessionController on SQLite and PostgreSQL: mark in one transaction, hint, event, return."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from corral.controller.agents import AgentController
from corral.controller.sessions import (
    CreationIdConflictError,
    SessionController,
    SubmissionError,
)
from corral.coordination.hints import Hint
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionSpec
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId
from corral.infra._redis import redis_client
from corral.infra.events import EventBus, open_event_bus
from corral.infra.events.redis import RedisEventBus
from corral.infra.hints import HintBus, open_hint_bus
from corral.infra.hints.redis import RedisHintBus
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.placements import commit_placements
from corral.store.sessions import SessionRepository
from corral.store.tables import resource_groups, sessions
from tests.conftest import UNREACHABLE_REDIS_URL
from tests.integration.store._factories import add_agents, add_user, placement

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def spec(**fields: object) -> SessionSpec:
    """A small valid batch spec with `fields` on top."""
    return SessionSpec.model_validate(
        {"image": "python", "command": ["python", "-c", "print(1)"], **fields}
    )


@pytest.fixture
async def buses() -> AsyncIterator[tuple[HintBus, EventBus]]:
    """In-process hint and event buses."""
    hints, events = await open_hint_bus("memory"), await open_event_bus("memory")
    yield hints, events
    await hints.close()
    await events.close()


@pytest.fixture
def controller(db: Database, buses: tuple[HintBus, EventBus]) -> SessionController:
    """A controller on the test database with a fixed clock."""
    return SessionController(db, buses[0], buses[1], clock=lambda: NOW)


async def test_enqueue_writes_pending_session_kernels_event_and_sets_the_hint(
    db: Database, controller: SessionController, buses: tuple[HintBus, EventBus]
) -> None:
    """A submission is PENDING with its kernels, logged as an event, and wakes the scheduler."""
    hints, events = buses
    owner = await add_user(db)
    async with events.subscribe() as live:
        submitted = await controller.enqueue(
            spec(resources={"cpu": "2", "mem": "1g"}, cluster_size=2, name="train"), owner
        )
        published = await asyncio.wait_for(anext(live), timeout=5)
    assert submitted.created
    [session] = await SessionRepository(db).get([submitted.session_id])
    assert (session.status, session.name, session.owner_id) == (
        SessionStatus.PENDING,
        "train",
        owner,
    )
    assert [k.status for k in session.kernels] == [KernelStatus.PENDING] * 2
    assert session.kernels[0].requested_slots == {"cpu": 2000, "mem": 1024**3 * 1000}
    assert await hints.consume(Hint.SCHEDULE)
    [logged] = await read_events(db, entity_id=str(submitted.session_id))
    assert (logged.kind, logged.owner_id, logged.payload["status"]) == (
        "session.created",
        owner,
        "PENDING",
    )
    assert published.id == logged.id


async def test_same_creation_id_from_the_same_owner_returns_the_first_session(
    db: Database, controller: SessionController
) -> None:
    """Resubmitting with a creation_id is idempotent per owner; another owner gets their own."""
    owner, other = await add_user(db), await add_user(db)
    first = await controller.enqueue(spec(creation_id="job-42"), owner)
    again = await controller.enqueue(spec(creation_id="job-42"), owner)
    theirs = await controller.enqueue(spec(creation_id="job-42"), other)
    assert (again.session_id, again.created) == (first.session_id, False)
    assert theirs.created and theirs.session_id != first.session_id
    async with db.read() as conn:
        count = await conn.scalar(
            sa.select(sa.func.count()).where(sessions.c.creation_id == "job-42")
        )
    assert count == 2


async def test_concurrent_submissions_with_one_creation_id_make_one_session(
    db: Database, buses: tuple[HintBus, EventBus]
) -> None:
    """Racing submissions of the same creation_id all return the one session that was made."""
    owner = await add_user(db)
    controller = SessionController(db, buses[0], clock=lambda: NOW)
    results = await asyncio.gather(
        *(controller.enqueue(spec(creation_id="race"), owner) for _ in range(5))
    )
    assert len({r.session_id for r in results}) == 1
    assert sum(r.created for r in results) == 1


async def test_racing_submissions_of_one_creation_id_with_other_requests_are_refused(
    db: Database, buses: tuple[HintBus, EventBus]
) -> None:
    """Submissions of one key racing (one group commit) make one session; those whose request
    differs from the one that made it are refused with the differing fields, alone."""
    owner = await add_user(db)
    controller = SessionController(db, buses[0], clock=lambda: NOW)
    results = await asyncio.gather(
        controller.enqueue(spec(creation_id="race"), owner),
        controller.enqueue(spec(creation_id="race", priority=7), owner),
        controller.enqueue(spec(creation_id="race"), owner),
        return_exceptions=True,
    )
    made = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, CreationIdConflictError)]
    assert len({r.session_id for r in made}) == 1 and len(made) == 2
    assert [(e.fields, e.session_id) for e in refused] == [(("priority",), made[0].session_id)]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"resource_group": "nowhere"}, "resource_group"),
        ({"dependencies": [str(uuid.uuid4())]}, "dependencies"),
    ],
)
async def test_references_that_do_not_exist_are_refused_naming_the_field(
    db: Database, controller: SessionController, fields: dict[str, object], field: str
) -> None:
    """An unknown resource group or dependency is refused, and nothing is written."""
    owner = await add_user(db)
    with pytest.raises(SubmissionError) as info:
        await controller.enqueue(spec(**fields), owner)
    assert info.value.field == field
    assert await SessionRepository(db).load([SessionStatus.PENDING]) == []


async def test_groups_created_or_deleted_by_another_manager_are_seen_at_once(
    db: Database, controller: SessionController
) -> None:
    """The kept group options never refuse a new group or accept a deleted one.

    Both writes go straight to the table, as another manager's would, so this process's kept
    read of the groups is stale each time the controller looks.
    """
    owner = await add_user(db)
    await controller.enqueue(spec(), owner)  # the groups are read and kept
    async with db.transaction() as conn:
        await conn.execute(
            sa.insert(resource_groups).values(name="fresh", options={}, created_at=NOW)
        )
    fresh = await controller.enqueue(spec(resource_group="fresh"), owner)
    assert fresh.created
    await controller.mark_terminate([fresh.session_id], "done with it")
    async with db.transaction() as conn:
        await conn.execute(sa.delete(sessions).where(sessions.c.resource_group == "fresh"))
        await conn.execute(sa.delete(resource_groups).where(resource_groups.c.name == "fresh"))
    with pytest.raises(SubmissionError) as info:
        await controller.enqueue(spec(resource_group="fresh"), owner)
    assert info.value.field == "resource_group"
    assert "'fresh' does not exist" in info.value.message


async def test_another_owners_session_is_not_a_valid_dependency(
    db: Database, controller: SessionController
) -> None:
    """Depending on someone else's session is refused as if it did not exist."""
    owner, other = await add_user(db), await add_user(db)
    theirs = await controller.enqueue(spec(), other)
    with pytest.raises(SubmissionError, match="dependencies"):
        await controller.enqueue(spec(dependencies=[str(theirs.session_id)]), owner)


async def test_terminate_cancels_pending_marks_started_and_ignores_ended(
    db: Database, controller: SessionController, buses: tuple[HintBus, EventBus]
) -> None:
    """PENDING → CANCELLED (cause user_cancelled), SCHEDULED → TERMINATING, the rest no-op."""
    hints, _ = buses
    owner = await add_user(db)
    pending = (await controller.enqueue(spec(), owner)).session_id
    started = (await controller.enqueue(spec(), owner)).session_id
    agents = await add_agents(db, [{"cpu": 8000, "mem": 10**15}])
    [loaded] = await SessionRepository(db).get([started])
    assert (await commit_placements(db, [placement(loaded, list(agents))], NOW)).placed
    unknown = SessionId(uuid.uuid4())

    outcome = await controller.mark_terminate([pending, started, unknown], "not needed")
    assert (outcome.cancelled, outcome.terminating, outcome.unchanged) == (
        [pending],
        [started],
        [unknown],
    )
    state = {s.id: s for s in await SessionRepository(db).get([pending, started])}
    assert state[pending].status is SessionStatus.CANCELLED
    assert state[pending].kernels[0].status is KernelStatus.CANCELLED
    assert state[started].status is SessionStatus.TERMINATING
    assert await hints.consume(Hint.TERMINATE)
    async with db.read() as conn:
        cause = await conn.scalar(
            sa.select(sessions.c.failure_cause).where(sessions.c.id == pending)
        )
    assert cause == "user_cancelled"
    logged = [e for e in await read_events(db) if e.kind == "session.status_changed"]
    assert {(e.entity_id, e.payload["to"]) for e in logged} == {
        (str(pending), "CANCELLED"),
        (str(started), "TERMINATING"),
    }

    again = await controller.mark_terminate([pending, started], "twice")
    assert again.unchanged == [pending, started]
    assert not await hints.consume(Hint.TERMINATE)


async def test_a_batch_is_written_in_one_go_and_refused_whole(
    db: Database, controller: SessionController
) -> None:
    """enqueue_many: one session per spec, creation_id repeats resolved; a bad spec writes none."""
    owner = await add_user(db)
    first, again, other = await controller.enqueue_many(
        [spec(creation_id="a"), spec(creation_id="a"), spec()], owner
    )
    assert first.created and not again.created and other.created
    assert again.session_id == first.session_id
    (later,) = await controller.enqueue_many([spec(creation_id="a")], owner)
    assert later == type(later)(first.session_id, created=False)
    pending = SessionRepository(db).load([SessionStatus.PENDING])
    before = len(await pending)
    with pytest.raises(SubmissionError) as refused:
        await controller.enqueue_many([spec(), spec(resource_group="nowhere")], owner)
    assert refused.value.field == "resource_group"
    assert len(await SessionRepository(db).load([SessionStatus.PENDING])) == before == 2


async def test_concurrent_submissions_share_a_transaction_and_fail_alone(
    db: Database, controller: SessionController
) -> None:
    """Ten enqueues at once: nine sessions, and only the bad spec's call is refused."""
    owner = await add_user(db)
    specs = [spec() for _ in range(9)]
    specs.insert(4, spec(resource_group="nowhere"))
    results = await asyncio.gather(
        *(controller.enqueue(s, owner) for s in specs), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1 and isinstance(results[4], SubmissionError)
    assert results[4].field == "resource_group"
    made = [r for r in results if not isinstance(r, BaseException)]
    assert len({m.session_id for m in made}) == 9
    assert len(await SessionRepository(db).load([SessionStatus.PENDING])) == 9


async def test_a_submission_stands_when_the_hint_and_event_servers_are_unreachable(
    db: Database,
) -> None:
    """Hints and live events go out after the commit: their servers being down costs latency
    (the long loop finds the session), never the submission, nor its cancellation."""
    hints = RedisHintBus(redis_client(UNREACHABLE_REDIS_URL))
    events = RedisEventBus(UNREACHABLE_REDIS_URL)
    controller = SessionController(db, hints, events, clock=lambda: NOW)
    owner = await add_user(db)
    try:
        submitted = await controller.enqueue(spec(), owner)
        assert submitted.created
        [session] = await SessionRepository(db).get([submitted.session_id])
        assert session.status is SessionStatus.PENDING
        outcome = await controller.mark_terminate([submitted.session_id], "not needed")
        assert outcome.cancelled == [submitted.session_id]
    finally:
        await hints.close()
        await events.close()
    assert [e.kind for e in await read_events(db, entity_id=str(submitted.session_id))] == [
        "session.created",
        "session.status_changed",
    ]


async def test_an_agent_registers_when_the_hint_server_is_unreachable(db: Database) -> None:
    """A registration is committed before its hints go out: the agent gets its token (had the
    request failed after the commit, the agent could not register again until declared lost)."""
    hints = RedisHintBus(redis_client(UNREACHABLE_REDIS_URL))
    agents = AgentController(db, hints, join_token="join")
    try:
        registration = await agents.register(
            "join", AgentId("a-1"), address="10.0.0.1", slots=ResourceSlots({"cpu": 4})
        )
    finally:
        await hints.close()
    assert registration.created and registration.token
