"""Whole session lifecycles through the coordinator and test agents, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from corral.domain.session import KernelIntent
from corral.domain.status import KERNEL_TERMINAL, KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId
from corral.store.agents import NewAgent, insert_agents
from corral.store.database import Database
from corral.store.events import SESSION_STATUS_CHANGED, read_events
from corral.store.tables import agents, sessions
from tests.integration._statements import recorded_statements
from tests.integration.coordination._harness import LIFECYCLE, Cluster, make_cluster
from tests.integration.store._factories import (
    NOW,
    add_group,
    assert_slots_consistent,
    set_group_options,
)

S, K = SessionStatus, KernelStatus
CPU4 = {"cpu": 4000}


async def ending(c: Cluster, sid: SessionId) -> tuple[str | None, int | None, str | None]:
    """The session's result, exit code and failure cause."""
    async with c.db.read() as conn:
        row = (
            await conn.execute(
                sa.select(sessions.c.result, sessions.c.exit_code, sessions.c.failure_cause).where(
                    sessions.c.id == sid
                )
            )
        ).one()
    return row[0], row[1], row[2]


async def test_single_kernel_happy_path(db: Database) -> None:
    """PENDING → … → RUNNING on its own; exit 0 ends TERMINATED/success, slots given back."""
    c = await make_cluster(db, [CPU4])
    sid = await c.submit()
    await c.settle()
    running = await c.session(sid)
    assert running.status is S.RUNNING
    assert [k.status for k in running.kernels] == [K.RUNNING]
    assert running.started_at == c.clock.now

    await c.agent.exit([k.id for k in running.kernels], exit_code=0)
    await c.settle()
    assert await c.status(sid) is S.TERMINATED
    assert await ending(c, sid) == ("success", 0, None)
    assert [to for _, _, to, _ in await c.moves_of(sid)] == [s.value for s in LIFECYCLE[1:]]
    await assert_slots_consistent(db, c.agents, [sid])

    events = [e for e in await read_events(db) if e.entity_id == str(sid)]
    changes = [e.payload["to"] for e in events if e.kind == SESSION_STATUS_CHANGED]
    assert changes == [s.value for s in LIFECYCLE[1:]]


async def revisions(c: Cluster) -> dict[str, int]:
    async with c.db.read() as conn:
        rows = await conn.execute(sa.select(agents.c.id, agents.c.assignment_revision))
        return {agent_id: revision for agent_id, revision in rows}


@pytest.mark.parametrize(
    ("handler", "stage", "intent"),
    [
        ("PrepareSessions", K.PREPARING, KernelIntent.PREPARE),
        ("StartSessions", K.CREATING, KernelIntent.RUN),
    ],
)
async def test_entering_a_stage_asks_the_agents_in_the_moves_own_write(
    db: Database, handler: str, stage: KernelStatus, intent: KernelIntent
) -> None:
    """A session entering a stage has its kernels moved and asked by one UPDATE: each kernel
    row written once, its desired state and generation with its status, its agent woken (the
    task's own run: a session the fused moves could not take on, `test_continued_stages`)."""
    c = await make_cluster(db, [CPU4] * 2, continue_stages=False)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    for step in ("ScheduleNewSessions", "PrepareSessions", "PromoteToPrepared", "StartSessions"):
        if step == handler:
            break
        await c.run(step)
        await c.agent.step()
    generations = {k.id: k.desired_generation for k in (await c.session(sid)).kernels}
    revisions_before = await revisions(c)
    with recorded_statements(db) as statements:
        assert await c.run(handler) == 1
    kernel_writes = [s for s in statements if s.lstrip().upper().startswith("UPDATE KERNELS")]
    assert len(kernel_writes) == 1, kernel_writes
    moved = (await c.session(sid)).kernels
    assert [(k.status, k.desired_state, k.stage_failure) for k in moved] == [
        (stage, intent, None)
    ] * 2
    assert all(k.desired_generation == generations[k.id] + 1 for k in moved)
    woken = await revisions(c)
    assert all(woken[a] > revisions_before[a] for a in c.agents)


async def test_multi_kernel_happy_path_and_a_failed_exit(db: Database) -> None:
    """Three kernels on three agents start together; a non-zero exit ends TERMINATED/failure."""
    c = await make_cluster(db, [CPU4] * 3, exit_code=lambda kernel: 3)
    sid = await c.submit(cluster_size=3, cluster_mode="multi-node")
    await c.settle()
    done = await c.session(sid)
    assert done.status is S.TERMINATED
    assert len({k.agent_id for k in done.kernels}) == 3
    assert {k.status for k in done.kernels} == {K.TERMINATED}
    assert await ending(c, sid) == ("failure", 3, None)
    await assert_slots_consistent(db, c.agents, [sid])


async def test_prepare_failures_retry_give_up_and_reschedule_elsewhere(db: Database) -> None:
    """A failing agent is retried 5 times, then the session returns to PENDING and moves on."""
    c = await make_cluster(db, [{"cpu": 2000}, {"cpu": 8000}])
    small, big = sorted(c.agents, key=lambda a: c.agents[a]["cpu"])
    c.agent.fail_prepare_on.add(small)  # concentrated placement picks the small one first
    sid = await c.submit()
    await c.settle()
    session = await c.session(sid)
    assert session.status is S.RUNNING
    assert [k.agent_id for k in session.kernels] == [big]
    assert session.failed_agents == (small,)
    prepare = [m for m in await c.moves_of(sid) if m[0] == "PrepareSessions"]
    assert prepare == [
        ("PrepareSessions", "SUCCESS", "PREPARING", 1),
        ("PrepareSessions", "NEED_RETRY", "PREPARING", 4),
        ("PrepareSessions", "GIVE_UP", "PENDING", 1),
        ("PrepareSessions", "SUCCESS", "PREPARING", 1),
    ]
    await assert_slots_consistent(db, c.agents, [sid])


async def test_a_failed_start_is_retried_on_the_same_agent(db: Database) -> None:
    """A start failure is one failed attempt: the agent is asked again and the next try runs."""
    c = await make_cluster(db, [CPU4])
    (agent,) = c.agents
    c.agent.fail_start_on.add(agent)
    sid = await c.submit()
    for step in ("ScheduleNewSessions", "PrepareSessions", "PromoteToPrepared", "StartSessions"):
        await c.agent.step()
        await c.run(step)
    assert await c.agent.step() == 1  # the failed start
    assert await c.run("StartSessions") == 0  # a failed attempt keeps CREATING
    assert await c.status(sid) is S.CREATING
    c.agent.fail_start_on.clear()
    await c.settle()
    assert await c.status(sid) is S.RUNNING
    start = [m for m in await c.moves_of(sid) if m[0] == "StartSessions"]
    assert [m[1] for m in start] == ["SUCCESS", "NEED_RETRY"]


async def test_a_session_stuck_preparing_expires_back_to_pending(db: Database) -> None:
    """Past PrepareSessions' timeout a silent agent's session is re-placed on another agent."""
    c = await make_cluster(db, [{"cpu": 2000}, {"cpu": 8000}])
    small, big = sorted(c.agents, key=lambda a: c.agents[a]["cpu"])
    c.agent.unresponsive.add(small)
    sid = await c.submit()
    await c.settle()
    assert await c.status(sid) is S.PREPARING
    c.clock.advance(899)
    await c.settle()
    assert await c.status(sid) is S.PREPARING
    c.clock.advance(2)
    await c.settle()
    session = await c.session(sid)
    assert session.status is S.RUNNING
    assert [k.agent_id for k in session.kernels] == [big]
    assert ("PrepareSessions", "EXPIRED", "PENDING", 1) in await c.moves_of(sid)
    await assert_slots_consistent(db, c.agents, [sid])


async def test_preparing_sessions_are_targets_only_when_due_by_their_own_group(
    db: Database,
) -> None:
    """Sessions waiting on their agents cost PrepareSessions nothing until one may expire; a
    group's shorter timeout is honoured while another group's sessions keep the default."""
    c = await make_cluster(db, [{"cpu": 8000}])
    await add_group(db, "fast", {"phase_limits": {"PrepareSessions": {"timeout_s": 60}}})
    fast_agent = NewAgent(AgentId("fast-1"), "10.9.0.1:6001", {"cpu": 8000}, "fast")
    await insert_agents(db, [fast_agent], NOW)  # the test agents never answer for it
    c.agents[fast_agent.id] = dict(fast_agent.capacity)
    c.agent.unresponsive.update(c.agents)
    slow, fast = await c.submit(), await c.submit(resource_group="fast")
    await c.settle()
    assert {await c.status(slow), await c.status(fast)} == {S.PREPARING}
    (prepare,) = [t for t in c.coordinator.tasks() if t.name == "PrepareSessions"]
    assert (await prepare.run()).targets == 0
    c.clock.advance(61)
    run = await prepare.run()
    # The shortest timeout of any group decides what is loaded; each group's its expiry.
    assert (run.targets, run.changed) == (2, 1)
    assert ("PrepareSessions", "EXPIRED", "PENDING", 1) in await c.moves_of(fast)
    assert await c.status(slow) is S.PREPARING
    await assert_slots_consistent(db, c.agents, [slow, fast])


async def test_a_kernel_failing_while_running_ends_the_session_in_error(db: Database) -> None:
    """One crashed kernel: the session goes TERMINATING, its peers are stopped, it ends ERROR."""
    c = await make_cluster(db, [CPU4] * 2)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    await c.settle()
    running = await c.session(sid)
    assert running.status is S.RUNNING
    await c.agent.crash([running.kernels[1].id], cause="oom_killed")
    await c.settle()
    ended = await c.session(sid)
    assert ended.status is S.ERROR
    assert [k.status for k in ended.kernels] == [K.TERMINATED, K.ERROR]
    assert (await ending(c, sid))[2] == "oom_killed"
    assert [to for _, _, to, _ in await c.moves_of(sid)][-2:] == ["TERMINATING", "ERROR"]
    await assert_slots_consistent(db, c.agents, [sid])


async def test_a_kernel_failing_before_running_ends_the_session_without_starting_it(
    db: Database,
) -> None:
    """A kernel lost while preparing ends the session in ERROR; the others never start."""
    c = await make_cluster(db, [CPU4] * 2)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    await c.run("ScheduleNewSessions")
    await c.run("PrepareSessions")
    session = await c.session(sid)
    await c.agent.crash([session.kernels[0].id], cause="agent_lost")
    await c.settle()
    ended = await c.session(sid)
    assert ended.status is S.ERROR
    assert all(k.status in KERNEL_TERMINAL and k.exit_code is None for k in ended.kernels)
    assert S.RUNNING.value not in [to for _, _, to, _ in await c.moves_of(sid)]


# How far to drive a session before terminating it, and how it then ends.
STEPS: list[tuple[str, ...]] = [
    (),
    ("ScheduleNewSessions",),
    ("ScheduleNewSessions", "PrepareSessions"),
    ("ScheduleNewSessions", "PrepareSessions", "agent", "PromoteToPrepared"),
    ("ScheduleNewSessions", "PrepareSessions", "agent", "PromoteToPrepared", "StartSessions"),
    (
        "ScheduleNewSessions",
        "PrepareSessions",
        "agent",
        "PromoteToPrepared",
        "StartSessions",
        "agent",
        "PromoteToRunning",
    ),
]
REACHED = [S.PENDING, S.SCHEDULED, S.PREPARING, S.PREPARED, S.CREATING, S.RUNNING]
ENDS = [S.CANCELLED, S.CANCELLED, S.CANCELLED, S.CANCELLED, S.CANCELLED, S.TERMINATED]


@pytest.mark.parametrize(
    ("steps", "reached", "end"), list(zip(STEPS, REACHED, ENDS, strict=True)), ids=REACHED
)
async def test_terminate_during_every_status(
    db: Database, steps: tuple[str, ...], reached: S, end: S
) -> None:
    """A terminate request ends the session from any status, nothing left held or running (each
    hop its task's own run, so the session can be stopped at SCHEDULED and PREPARED)."""
    c = await make_cluster(db, [CPU4] * 2, continue_stages=False)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    for step in steps:
        if step == "agent":
            await c.agent.step()
        else:
            assert await c.run(step) == 1, step
    assert await c.status(sid) is reached
    await c.controller.mark_terminate([sid], "user asked")
    await c.settle()
    ended = await c.session(sid)
    assert ended.status is end
    assert all(k.status in KERNEL_TERMINAL for k in ended.kernels)
    await assert_slots_consistent(db, c.agents, [sid])


async def test_terminate_is_forced_when_the_agent_never_confirms(db: Database) -> None:
    """A hung agent cannot hold a session: TerminateSessions expires it to TERMINATED."""
    c = await make_cluster(db, [CPU4])
    sid = await c.submit()
    await c.settle()
    c.agent.unresponsive.update(c.agents)
    await c.controller.mark_terminate([sid], "user asked")
    await c.settle()
    assert await c.status(sid) is S.TERMINATING
    c.clock.advance(301)
    await c.settle()
    ended = await c.session(sid)
    assert ended.status is S.TERMINATED
    assert [k.status for k in ended.kernels] == [K.TERMINATED]
    await assert_slots_consistent(db, c.agents, [sid])


async def test_pending_timeout_cancels_what_waited_too_long(db: Database) -> None:
    """With a group PENDING timeout, a session waiting for capacity is CANCELLED when it passes."""
    c = await make_cluster(db, [{"cpu": 1000}])
    await set_group_options(
        db, "default", {"phase_limits": {"ScheduleNewSessions": {"timeout_s": 60}}}
    )
    first = await c.submit()
    await c.settle()
    waiting = await c.submit()
    await c.settle()
    assert await c.status(waiting) is S.PENDING
    c.clock.advance(61)
    await c.settle()
    assert await c.status(first) is S.RUNNING
    assert await c.status(waiting) is S.CANCELLED
    assert ("ScheduleNewSessions", "EXPIRED", "CANCELLED", 1) in await c.moves_of(waiting)


async def test_creating_expiry_takes_started_kernels_back_from_their_agents(db: Database) -> None:
    """A CREATING session that expires returns to PENDING whole, even its already running kernel."""
    c = await make_cluster(db, [CPU4] * 2, continue_stages=False)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node")
    for step in ("ScheduleNewSessions", "PrepareSessions", "PromoteToPrepared", "StartSessions"):
        await c.agent.step()
        await c.run(step)
    session = await c.session(sid)
    c.agent.unresponsive.add(session.kernels[1].agent_id)  # type: ignore[arg-type]
    await c.agent.step()
    assert [k.status for k in (await c.session(sid)).kernels] == [K.RUNNING, K.CREATING]
    c.clock.advance(301)
    assert await c.run("StartSessions") == 1
    back = await c.session(sid)
    assert back.status is S.PENDING
    assert [(k.status, k.agent_id) for k in back.kernels] == [(K.PENDING, None)] * 2
    await assert_slots_consistent(db, c.agents, [sid])


@pytest.mark.parametrize("handler", ["ScheduleNewSessions", "PrepareSessions"])
async def test_a_lifecycle_run_reads_its_targets_and_limits_on_one_connection(
    db: Database, handler: str
) -> None:
    """Loading the targets and every group's limits is one read, whatever the handler kind.

    PrepareSessions watches sessions (it needs the limits to find the expiring ones), the
    scheduler does not; before the read was shared, each took a second connection for the
    limits. A run that places one session: that read, the scheduler's read of the groups with
    pending sessions, its snapshot read (the first page of the queue with the agents) and its
    commit; a PrepareSessions run: that read, its check of the agents, and the transaction
    asking the agent. Either then reads when it next comes due (`coordination.due`, at most
    once a second per task). (Counted as connections taken from the pool: on PostgreSQL the
    first two reads of PrepareSessions are not transactions, see Database.read_statements.)
    """
    c = await make_cluster(db, [CPU4], continue_stages=handler != "PrepareSessions")
    await c.submit()
    if handler == "PrepareSessions":
        assert await c.run("ScheduleNewSessions") == 1
    checkouts: list[object] = []

    def on_checkout(dbapi_connection: object, *_args: object) -> None:
        checkouts.append(dbapi_connection)

    pool = db.engine.sync_engine.pool
    sa.event.listen(pool, "checkout", on_checkout)
    try:
        assert await c.run(handler) == 1
    finally:
        sa.event.remove(pool, "checkout", on_checkout)
    assert len(checkouts) == (4 if handler == "ScheduleNewSessions" else 3) + 1
