"""Due times are kept (issue 32): a phase timeout and a start time are reported by the run
that sees them and fire at their time, not at the next long loop."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.due import DUE_RECHECK_S, DUE_SLACK_S
from corral.coordination.judge import PhaseLimits
from corral.coordination.manager import LoopIntervals
from corral.domain.status import SessionStatus
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.store.database import Database
from corral.store.users import create_user, issue_token
from tests.integration.coordination._harness import make_cluster
from tests.integration.store._factories import NOW

SCHEDULE = "ScheduleNewSessions"
ONE_CPU = {"cpu": "1"}
DEADLINE_S = 30.0


async def test_a_pending_timeout_is_due_when_it_runs_out(db: Database) -> None:
    """The scheduling run reports the pending timeout as due; run then, it cancels the
    session (the run just before leaves it alone)."""
    cluster = await make_cluster(db, [{"cpu": 1000}])
    coordinator = SessionCoordinator(
        db, cluster.hints, clock=cluster.clock, limits={SCHEDULE: PhaseLimits(timeout_s=8.0)}
    )
    [schedule] = [t for t in coordinator.tasks() if t.name == SCHEDULE]
    await cluster.submit(resources=ONE_CPU)  # takes the only cpu
    sid = await cluster.submit(resources=ONE_CPU)  # waits for it
    run = await schedule.run()
    assert await cluster.status(sid) is SessionStatus.PENDING
    assert run.due_in_s == pytest.approx(8.0 + DUE_SLACK_S)
    cluster.clock.advance(7.9)
    assert (await schedule.run()).due_in_s == pytest.approx(0.1 + DUE_SLACK_S)
    assert await cluster.status(sid) is SessionStatus.PENDING
    cluster.clock.advance(0.1 + DUE_SLACK_S)
    run = await schedule.run()
    assert await cluster.status(sid) is SessionStatus.CANCELLED
    assert run.due_in_s is None  # nothing else will come due


async def test_a_start_time_is_due_when_it_comes(db: Database) -> None:
    """A session with a start time 30 s ahead is reported due then, and placed at that run."""
    cluster = await make_cluster(db, [{"cpu": 1000}])
    coordinator = cluster.coordinator
    [schedule] = [t for t in coordinator.tasks() if t.name == SCHEDULE]
    sid = await cluster.submit(starts_at=(NOW + timedelta(seconds=30)).isoformat())
    run = await schedule.run()
    assert run.due_in_s == pytest.approx(30.0 + DUE_SLACK_S)
    assert await cluster.status(sid) is SessionStatus.PENDING
    cluster.clock.advance(30.0 + DUE_SLACK_S)
    await schedule.run()
    assert await cluster.status(sid) is SessionStatus.PREPARING  # placed and asked to prepare


async def test_a_session_entering_within_the_recheck_second_is_looked_at_then(
    db: Database,
) -> None:
    """A run within a second of the last due-time read reports a wake at the end of that
    second (not "nothing due"), so a session that entered meanwhile is not missed."""
    cluster = await make_cluster(db, [{"cpu": 1000}])
    coordinator = SessionCoordinator(
        db, cluster.hints, clock=cluster.clock, limits={SCHEDULE: PhaseLimits(timeout_s=8.0)}
    )
    [schedule] = [t for t in coordinator.tasks() if t.name == SCHEDULE]
    await cluster.submit(resources=ONE_CPU)  # takes the only cpu
    assert (await schedule.run()).due_in_s is None  # read: nothing left pending
    cluster.clock.advance(0.25)
    await cluster.submit(resources=ONE_CPU)
    assert (await schedule.run()).due_in_s == pytest.approx(DUE_RECHECK_S - 0.25)
    cluster.clock.advance(DUE_RECHECK_S - 0.25)
    assert (await schedule.run()).due_in_s == pytest.approx(7.25 + DUE_SLACK_S)


async def test_a_manager_cancels_at_its_pending_timeout_not_at_the_long_loop(
    database_url: str, tmp_path: Path
) -> None:
    """Through the API of a running manager with a 60 s long loop: a group's 1 s pending
    timeout cancels a waiting session within moments of its due time."""
    manager = ManagerDaemon(
        ManagerConfig(
            database_url=database_url,
            port=0,
            join_token="due-test",
            prefix=f"due-{tmp_path.name[-8:]}",
            intervals=LoopIntervals(short_interval_s=2.0, long_interval_s=60.0),
            grace_period_s=2,
        )
    )
    runner = await manager.start()
    try:
        assert manager.parts is not None
        db, now = manager.parts.db, datetime.now().astimezone()
        admin = await issue_token(db, await create_user(db, "root", "admin", now), "t", now)
        user = await issue_token(db, await create_user(db, "alice", "user", now), "t", now)
        as_admin = {"Authorization": f"Bearer {admin.secret}"}
        as_user = {"Authorization": f"Bearer {user.secret}"}
        async with httpx.AsyncClient(base_url=manager.url, timeout=DEADLINE_S) as http:
            limits = {"options": {"phase_limits": {SCHEDULE: {"timeout_s": 1}}}}
            patched = await http.patch("/v1/resource-groups/default", json=limits, headers=as_admin)
            assert patched.status_code == 200, patched.text
            # No agent has joined: the session waits in PENDING.
            body = {"image": "python", "command": ["true"], "resources": ONE_CPU}
            created = await http.post("/v1/sessions", json=body, headers=as_user)
            assert created.status_code in (200, 201, 202), created.text
            session_id = created.json()["id"]
            deadline = time.monotonic() + DEADLINE_S
            while True:
                session = (await http.get(f"/v1/sessions/{session_id}", headers=as_user)).json()
                if session["status"] == SessionStatus.CANCELLED.value:
                    break
                assert time.monotonic() < deadline, session
                await asyncio.sleep(0.05)
        created_at = datetime.fromisoformat(session["created_at"])
        ended_at = datetime.fromisoformat(session["status_changed_at"])
        # Due 1 s after creation; the long loop would have taken 60 s. The margin is for a
        # loaded machine, not for the mechanism (which wakes 10 ms after the due time).
        assert (ended_at - created_at).total_seconds() < 1.0 + 5.0
    finally:
        await manager.stop()
        await asyncio.wait_for(runner, DEADLINE_S)
