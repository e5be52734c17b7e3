"""Sessions keep moving while the managers' Redis (hints and locks) is down (issue 32,
defect 4): the loops run unlocked and tick without hints; the database stays the truth."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import pytest

from corral.testing.agent import TestAgent
from corral.testing.redis_server import RedisServer
from tests.integration.coordination.test_orchestrated import (
    SETTLE_DEADLINE_S,
    AllTerminated,
    agents_running,
    assert_each_move_recorded_once,
    batch_spec,
    eventually,
    open_database,
    open_hints,
    start_manager,
)
from tests.integration.store._factories import add_agents, add_user


@pytest.mark.postgres
async def test_sessions_keep_moving_while_redis_is_down(
    postgres_database_url: str,
    own_redis: RedisServer,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two managers on Redis hints and locks: Redis killed with sessions in flight, and more
    submitted during the outage; every session still ends, each move recorded once, with no
    long loop to help (60 s)."""
    url, redis_url = postgres_database_url, own_redis.url
    caplog.set_level(logging.WARNING, logger="corral.coordination.loop")
    async with AsyncExitStack() as stack:
        agent_db = await open_database(stack, url)
        agents = await add_agents(agent_db, [{"cpu": 2000}] * 4)
        owner = await add_user(agent_db)
        agent_hints = await open_hints(stack, "redis", namespace, agent_db, redis_url)
        agent = TestAgent(agent_db, list(agents), hints=agent_hints)
        managers = [
            await start_manager(stack, url, "redis", namespace, redis_url, long_interval_s=60.0)
            for _ in range(2)
        ]
        agent_tasks = await stack.enter_async_context(agents_running(agent))
        for i in range(10):
            await managers[i % 2].controller.enqueue(batch_spec(), owner)
        own_redis.kill()
        for i in range(10):
            await managers[i % 2].controller.enqueue(batch_spec(), owner)
        await eventually(AllTerminated(agent_db, 20), SETTLE_DEADLINE_S, watch=agent_tasks)
        await assert_each_move_recorded_once(agent_db, 20)
        unlocked = sum(
            loop.unlocked_runs for manager in managers for loop in manager.orchestrator.loops
        )
    assert unlocked > 0
    assert "coordinator.locks_unavailable" in caplog.messages
