"""End to end, all-or-nothing admission (spec document 2): a real manager and two `corral
agent` processes; a 2-kernel multi-node session whose second agent hangs is evicted when its
kernels are not all ready in time, requeued, and runs once the agent is back."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.domain.status import SessionStatus
from tests.e2e._cluster import live_cluster, poll

pytestmark = pytest.mark.timeout(300)
S = SessionStatus


async def test_a_session_whose_second_kernel_cannot_start_in_time_is_evicted_and_retried(
    database_url: str, tmp_path: Path
) -> None:
    # A hung agent must not be declared LOST before the session times out.
    async with (
        live_cluster(database_url, tmp_path, heartbeat_timeout_s=60) as cluster,
        cluster.admin_api() as admin,
    ):
        # Turned on through the API while the manager runs: its EvictNotReady has already run
        # and found no group to watch, so the change itself must wake it (were it not, the
        # eviction would wait for the long loop's minute).
        wait = {"enable": True, "timeout_s": 2, "requeuing": {"backoff_base_s": 1}}
        await _set_wait(admin, wait)
        cluster.start_agent("node-a", "cpu=1,mem=1g", address="127.0.0.1")
        cluster.start_agent("node-b", "cpu=1,mem=1g", address="127.0.0.2")
        await cluster.wait_agents_alive({"node-a", "node-b"})
        hung = cluster.agents["node-b"].pid
        os.kill(hung, signal.SIGSTOP)
        try:
            sid = await cluster.submit(
                image="python",
                command=["python", "-c", "print('both ranks ran')"],
                resources={"cpu": 1, "mem": "256m"},
                cluster_mode="multi-node",
                cluster_size=2,
            )

            async def evicted() -> bool:
                return int((await cluster.session(sid))["requeue_count"]) >= 1

            await poll(evicted, what="the session to be evicted", deadline_s=30, log=cluster)
            row = await cluster.session(sid)
            assert row["eviction_reason"] == "KernelsReadyTimeout"
            assert "WaitForStart" in (row["status_info"] or "")
            # The retry must not hang on how fast a loaded machine starts two processes: once
            # evicted, the session gets a start timeout no machine misses.
            await _set_wait(admin, {**wait, "timeout_s": 300})
        finally:
            os.kill(hung, signal.SIGCONT)
        row = await cluster.wait_status(sid)
        assert (row["status"], row["result"]) == (S.TERMINATED, "success"), row
        assert row["requeue_count"] >= 1 and row["kernels_ready"] is True
        assert {k["agent_id"] for k in await cluster.kernels(sid)} == {"node-a", "node-b"}


async def _set_wait(admin: httpx.AsyncClient, wait: dict[str, Any]) -> None:
    changed = await admin.patch(
        "/v1/resource-groups/default", json={"options": {"wait_for_kernels_ready": wait}}
    )
    assert changed.status_code == 200, changed.text
