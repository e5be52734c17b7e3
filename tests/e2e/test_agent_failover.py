"""End to end: an agent given two managers fails over when the first goes away and returns to
it when it is back (issue 32). Two real managers on one PostgreSQL database, `corral agent` as
a process with `--manager URL1,URL2`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from corral.domain.spec import SessionSpec
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.manager.daemon import ManagerDaemon
from tests.e2e._cluster import LiveCluster, live_cluster, poll

pytestmark = pytest.mark.postgres

AGENT = "failover-agent"
JOB = {"image": "python", "command": ["python", "-c", "print(1)"], "resources": {"cpu": 1}}


async def run_job(cluster: LiveCluster, manager: ManagerDaemon) -> None:
    """Submit a job through `manager` and wait for it to end well (read from its database)."""
    assert manager.parts is not None
    submitted = await manager.parts.sessions.enqueue(SessionSpec.model_validate(JOB), cluster.owner)
    cluster.db = manager.parts.db  # the cluster's reads go through a manager that is up
    row = await cluster.wait_status(SessionId(submitted.session_id))
    assert (row["status"], row["result"]) == (SessionStatus.TERMINATED, "success"), row


def port_of(manager: ManagerDaemon) -> int:
    return int(manager.url.rsplit(":", 1)[1])


async def test_an_agent_fails_over_to_the_second_manager_and_back(
    postgres_database_url: str, tmp_path: Path
) -> None:
    """With the first manager stopped, the agent runs a job through the second; with the first
    back and the second stopped, it runs the next job through the first again."""
    async with live_cluster(postgres_database_url, tmp_path) as cluster:
        first = cluster.manager
        first_port = port_of(first)
        second, _ = await cluster.start_manager()
        cluster.start_agent(
            AGENT, "cpu=1,mem=1g", "--failback-after", "1", managers=[first.url, second.url]
        )
        await cluster.wait_agents_alive({AGENT})

        await first.stop()
        await cluster.runner
        await run_job(cluster, second)

        cluster.manager = ManagerDaemon(replace(first.config, port=first_port))
        cluster.runner = await cluster.manager.start()
        back = cluster.manager
        assert back.parts is not None
        polls = back.parts.agents.polls

        async def polling_the_first() -> bool:
            return polls.waiting(AGENT) > 0

        await poll(polling_the_first, what="the agent's long-poll back at the first manager")
        await second.stop()
        await run_job(cluster, back)
        assert "agent.manager_switched" in cluster.agent_log(AGENT)
