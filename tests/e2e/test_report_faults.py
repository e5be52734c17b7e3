"""End to end: a real manager over HTTP and a real agent daemon, with reports' answers lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from corral.agent.client import HttpManagerClient, ManagerRejectedError, ManagerUnavailableError
from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.protocol import KernelReportMessage, ReportAccepted
from corral.agent.runtime.simulated import SimulatedRuntime
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus, SessionStatus
from corral.store.tables import kernel_history, session_history
from tests.e2e._cluster import JOIN_TOKEN, LiveCluster, live_cluster

S, K = SessionStatus, KernelStatus


class FaultyClient:
    """The agent's real HTTP client (`HttpManagerClient`) behind a fault of our own: the
    other calls pass through as they are."""

    def __init__(self, inner: HttpManagerClient) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class LoseAnswerAfterCommit(FaultyClient):
    """The manager "killed" between commit and answer: the first report batch naming
    PREPARED reaches the manager (which commits it) and its answer is lost; the agent's later
    batches fail to connect until one carries the kernel's end, so the agent sends again
    what it still thinks undelivered together with RUNNING … TERMINATED."""

    lost: list[list[str]]
    resent: list[list[str]]

    def __init__(self, inner: HttpManagerClient) -> None:
        super().__init__(inner)
        self.lost, self.resent = [], []

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """Forward, except for the faults above."""
        statuses = [r.status.value for r in reports]
        if not self.lost and K.PREPARED.value in statuses:
            await self.inner.report(agent_id, reports)  # committed on the manager
            self.lost.append(statuses)
            raise ManagerUnavailableError("the manager died before answering")
        if self.lost and not self.resent:
            if K.TERMINATED.value not in statuses:
                raise ManagerUnavailableError("the manager is restarting")
            self.resent.append(statuses)
        return await self.inner.report(agent_id, reports)


class RefuseTheEnd(FaultyClient):
    """The first report batch that ends a kernel is turned away on its way (a proxy's 413):
    the agent drops that batch, so the manager never hears the kernel end."""

    refused: list[list[str]]

    def __init__(self, inner: HttpManagerClient) -> None:
        super().__init__(inner)
        self.refused = []

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """Forward, except for the one batch."""
        statuses = [r.status.value for r in reports]
        if not self.refused and K.TERMINATED.value in statuses:
            self.refused.append(statuses)
            raise ManagerRejectedError(413, {"detail": "request entity too large"})
        return await self.inner.report(agent_id, reports)


@contextlib.asynccontextmanager
async def agent_daemon(
    cluster: LiveCluster, agent_id: str, fault: type[FaultyClient], tmp_path: Path
) -> AsyncIterator[FaultyClient]:
    """A real agent daemon (simulated runtime) in this process, over HTTP to the manager."""
    client = fault(HttpManagerClient(cluster.manager.url))
    daemon = AgentDaemon(
        AgentConfig(
            agent_id=agent_id,
            token=JOIN_TOKEN,
            address="127.0.0.1",
            slots=ResourceSlots.parse("cpu=2,mem=2g"),
            data_dir=tmp_path / agent_id,
            backoff_initial_s=0.01,
            backoff_max_s=0.05,
        ),
        client,
        SimulatedRuntime(),
    )
    running = asyncio.create_task(daemon.run())
    try:
        yield client
    finally:
        await daemon.stop()
        await running


async def test_a_report_whose_answer_was_lost_is_resent_and_the_kernel_runs_once(
    database_url: str, tmp_path: Path
) -> None:
    """PREPARED committed, answer lost, re-sent with RUNNING…TERMINATED: the session ends once."""
    async with (
        live_cluster(database_url, tmp_path) as cluster,
        agent_daemon(cluster, "node-a", LoseAnswerAfterCommit, tmp_path) as fault,
    ):
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="python", command=["true"], resources={"cpu": 1, "mem": "256m"}
        )
        row = await cluster.wait_status(sid)
        assert row["status"] == S.TERMINATED, row
        assert K.PREPARED.value in fault.lost[0]
        # The assignment showed the kernel CREATING: the agent knew PREPARED had arrived.
        assert fault.resent == [[K.RUNNING.value, K.TERMINATING.value, K.TERMINATED.value]]
        async with cluster.db.read() as conn:
            session_moves = [
                r.to_status
                for r in await conn.execute(
                    sa.select(session_history.c.to_status)
                    .where(session_history.c.session_id == sid)
                    .order_by(session_history.c.id)
                )
            ]
            started = await conn.scalar(
                sa.select(sa.func.count()).where(
                    kernel_history.c.session_id == sid,
                    kernel_history.c.to_status == K.RUNNING.value,
                )
            )
        assert S.PENDING.value not in session_moves, session_moves  # never placed again
        assert started == 1


async def test_a_running_session_whose_agent_stops_reporting_its_kernel_is_reconciled(
    database_url: str, tmp_path: Path
) -> None:
    """The kernel's end never reaches the manager (session RUNNING, slots held): quiet past
    its bound, the kernel is asked about; the agent answers with its end; the session ends."""
    async with (
        live_cluster(database_url, tmp_path, running_quiet_s=1.0) as cluster,
        agent_daemon(cluster, "node-a", RefuseTheEnd, tmp_path) as fault,
    ):
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="python", command=["true"], resources={"cpu": 1, "mem": "256m"}
        )
        row = await cluster.wait_status(sid)
        assert row["status"] == S.TERMINATED, row
        assert fault.refused and fault.refused[0][-1] == K.TERMINATED.value
        (kernel,) = await cluster.kernels(sid)
        assert (kernel["status"], kernel["occupied_slots"], kernel["asked_at"]) == (
            K.TERMINATED,
            None,
            None,
        )
        async with cluster.db.read() as conn:
            started = await conn.scalar(
                sa.select(sa.func.count()).where(
                    kernel_history.c.session_id == sid,
                    kernel_history.c.to_status == K.RUNNING.value,
                )
            )
        assert started == 1
