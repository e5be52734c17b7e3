"""`agent_kernels` follows `kernels.agent_id` exactly, and queries by agent go through it."""

from __future__ import annotations

import sqlalchemy as sa

from corral.domain.status import KernelStatus
from corral.domain.types import AgentId
from corral.store import tables
from corral.store.agents import NewAgent, insert_agents
from corral.store.assignments import read_assignment, read_assignments
from corral.store.database import Database
from corral.store.migrate import downgrade, upgrade
from corral.store.placements import commit_placements
from corral.store.session_views import delete_session
from corral.store.sessions import SessionRepository
from tests.integration.store._factories import (
    CANCEL,
    MARK_TERMINATING,
    NOW,
    PREPARE,
    RELEASE,
    TERMINATE,
    add_session_ids,
    add_user,
    on,
    place_all,
    placement,
)


async def _listed(db: Database) -> set[tuple[str, object]]:
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(tables.agent_kernels.c.agent_id, tables.agent_kernels.c.kernel_id)
        )
        return {(agent, kernel) for agent, kernel in rows}


async def test_a_kernel_is_listed_under_its_agent_while_it_has_one(db: Database) -> None:
    """Placed: listed; back to PENDING: not listed; placed again on the same agent: listed."""
    repo = SessionRepository(db)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 8000})], NOW)
    [sid] = await add_session_ids(db, await add_user(db), 1, cpu_milli=1000, cluster_size=2)
    await place_all(db, [sid], AgentId("a1"))
    [session] = await repo.get([sid])
    assert await _listed(db) == {("a1", k.id) for k in session.kernels}

    await repo.apply([on(RELEASE, [sid])], NOW)
    assert await _listed(db) == set()
    emptied = await read_assignment(db, AgentId("a1"))
    assert emptied is not None and emptied.kernels == ()

    await place_all(db, [sid], AgentId("a1"))  # the same rows again: no conflict
    assert await _listed(db) == {("a1", k.id) for k in session.kernels}
    assignment = await read_assignment(db, AgentId("a1"))
    assert assignment is not None
    assert {k.id for k in assignment.kernels} == {k.id for k in session.kernels}


async def test_an_agent_no_longer_lists_a_kernel_placed_elsewhere_since(db: Database) -> None:
    """Requeued from a1 and placed on a2: a1's assignment is empty, a2's has the kernel."""
    repo = SessionRepository(db)
    await insert_agents(
        db,
        [
            NewAgent(AgentId("a1"), "h1", {"cpu": 8000}),
            NewAgent(AgentId("a2"), "h2", {"cpu": 8000}),
        ],
        NOW,
    )
    [sid] = await add_session_ids(db, await add_user(db), 1, cpu_milli=1000)
    await place_all(db, [sid], AgentId("a1"))
    await repo.apply([on(RELEASE, [sid])], NOW)
    await place_all(db, [sid], AgentId("a2"))

    first = await read_assignment(db, AgentId("a1"))
    second = await read_assignment(db, AgentId("a2"))
    assert first is not None and second is not None
    assert first.kernels == ()
    [kernel] = (await repo.get([sid]))[0].kernels
    assert [k.id for k in second.kernels] == [kernel.id]


async def test_an_ended_kernel_stays_listed_and_a_removed_session_leaves_nothing(
    db: Database,
) -> None:
    """The agent of an ended kernel is history; removing the session removes its rows too."""
    repo = SessionRepository(db)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 8000})], NOW)
    owner = await add_user(db)
    ended, cancelled = await add_session_ids(db, owner, 2, cpu_milli=1000)
    await place_all(db, [ended], AgentId("a1"))
    await repo.apply([on(PREPARE, [ended])], NOW)
    await repo.apply([on(MARK_TERMINATING, [ended])], NOW)
    await repo.apply([on(TERMINATE, [ended])], NOW)
    await repo.apply([on(CANCEL, [cancelled])], NOW)
    [session] = await repo.get([ended])
    assert session.kernels[0].status is KernelStatus.TERMINATED
    assert await _listed(db) == {("a1", session.kernels[0].id)}

    await delete_session(db, ended)
    assert await _listed(db) == set()


async def test_the_migration_lists_the_kernels_already_placed(db: Database) -> None:
    """Upgrading from 0006 fills `agent_kernels` from `kernels.agent_id`."""
    repo = SessionRepository(db)
    await insert_agents(db, [NewAgent(AgentId("a1"), "h1", {"cpu": 8000})], NOW)
    placed, _pending = await add_session_ids(db, await add_user(db), 2, cpu_milli=1000)
    await place_all(db, [placed], AgentId("a1"))
    [kernel] = (await repo.get([placed]))[0].kernels
    await downgrade(db, "0006")
    await upgrade(db)
    assert await _listed(db) == {("a1", kernel.id)}


async def test_assignments_name_every_kernels_hosts_and_the_sessions_spec(db: Database) -> None:
    """A two-kernel session across two agents: each agent's kernel lists both agents'
    addresses in rank order; a single-kernel session lists its own agent's; every kernel
    carries its session's spec as submitted."""
    await insert_agents(
        db,
        [
            NewAgent(AgentId("a1"), "10.0.0.1", {"cpu": 8000}),
            NewAgent(AgentId("a2"), "10.0.0.2", {"cpu": 8000}),
        ],
        NOW,
    )
    owner = await add_user(db)
    [pair] = await add_session_ids(db, owner, 1, cpu_milli=1000, cluster_size=2)
    [single] = await add_session_ids(db, owner, 1, cpu_milli=1000)
    repo = SessionRepository(db)
    found = {s.id: s for s in await repo.get([pair, single])}
    outcome = await commit_placements(
        db,
        [
            placement(found[pair], [AgentId("a2"), AgentId("a1")]),
            placement(found[single], [AgentId("a2")]),
        ],
        NOW,
    )
    assert sorted(outcome.placed) == sorted([pair, single])
    assignments = await read_assignments(db, [AgentId("a1"), AgentId("a2")])
    first, second = assignments.values()
    hosts = {
        (k.session_id, k.cluster_index): k.cluster_hosts
        for assignment in (first, second)
        for k in assignment.kernels
    }
    assert hosts == {
        (pair, 0): ("10.0.0.2", "10.0.0.1"),
        (pair, 1): ("10.0.0.2", "10.0.0.1"),
        (single, 0): ("10.0.0.2",),
    }
    submitted = {"image": "python", "command": ["true"]}
    assert all(k.spec == submitted for a in (first, second) for k in a.kernels)
