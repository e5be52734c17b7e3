"""End to end: a real manager over HTTP and a real agent daemon, with reports' answers lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from corral.agent.client import HttpManagerClient, ManagerRejectedError, ManagerUnavailableError
from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.protocol import KernelReportMessage, ReportAccepted
from corral.agent.runtime import KERNEL_LOST_CAUSE
from corral.agent.runtime.sim_journal import JOURNAL_NAME, Journal, JournalEvent, read_journal
from corral.agent.runtime.simulated import Latency, SimulatedRuntime, SimulationProfile
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus, SessionStatus
from corral.store.tables import kernel_history, session_history
from tests.e2e._cluster import JOIN_TOKEN, LiveCluster, live_cluster, poll

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


class DyingJournal(Journal):
    """A simulated agent's journal that records nothing once the agent is "killed"."""

    dead = False

    def write(self, event: JournalEvent, **fields: Any) -> None:
        """Append, unless the agent died."""
        if not self.dead:
            super().write(event, **fields)


class NoRunningReport(FaultyClient):
    """The manager hears PREPARED but never RUNNING (its answers lost, then the agent dies):
    a batch naming RUNNING fails to connect, and once `dead` every call does."""

    dead = False

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """Forward, except for the faults above."""
        if self.dead or any(r.status is K.RUNNING for r in reports):
            raise ManagerUnavailableError("the manager cannot be reached")
        return await self.inner.report(agent_id, reports)

    async def assignment(self, *args: Any, **kwargs: Any) -> Any:
        """Forward, unless the agent died."""
        if self.dead:
            raise ManagerUnavailableError("the agent is dead")
        return await self.inner.assignment(*args, **kwargs)


def _daemon(data_dir: Path, client: Any, runtime: SimulatedRuntime) -> AgentDaemon:
    return AgentDaemon(
        AgentConfig(
            agent_id="node-a",
            token=JOIN_TOKEN,
            address="127.0.0.1",
            slots=ResourceSlots.parse("cpu=2,mem=2g"),
            data_dir=data_dir,
            backoff_initial_s=0.01,
            backoff_max_s=0.05,
            shutdown_flush_s=0.0,  # killed: nothing is sent on the way out
        ),
        client,
        runtime,
    )


@pytest.mark.parametrize(
    ("run_s", "recorded", "status", "cause"),
    [
        # Killed while the kernel ran: it died with the agent.
        (3600.0, JournalEvent.START, S.ERROR, KERNEL_LOST_CAUSE),
        # Killed after the kernel exited, before the manager heard it run or end.
        (0.0, JournalEvent.END, S.TERMINATED, None),
    ],
    ids=["running", "ended"],
)
async def test_an_agent_killed_after_it_started_a_kernel_does_not_start_it_again(
    database_url: str,
    tmp_path: Path,
    run_s: float,
    recorded: JournalEvent,
    status: SessionStatus,
    cause: str | None,
) -> None:
    """The agent starts a kernel and dies before the manager hears RUNNING (the manager still
    says CREATING). Back with the same data directory, it finds the kernel in its record and
    reports it as it stands: lost if it was running, its exit if it had ended. The job is not
    run a second time."""
    data_dir = tmp_path / "node-a"
    journal_path = data_dir / JOURNAL_NAME
    profile = SimulationProfile(run=Latency.fixed(run_s))
    # The agent is back long before the manager would count it lost (then the kernel, not
    # started as far as the manager knows, would be placed again: a new placement).
    async with live_cluster(database_url, tmp_path, heartbeat_timeout_s=60.0) as cluster:
        journal = DyingJournal(journal_path)
        journal.write(JournalEvent.BOOT)
        fault = NoRunningReport(HttpManagerClient(cluster.manager.url))
        first = _daemon(data_dir, fault, SimulatedRuntime(profile, journal=journal))
        running = asyncio.create_task(first.run())
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="python", command=["true"], resources={"cpu": 1, "mem": "256m"}
        )

        def journaled(event: JournalEvent) -> list[Any]:
            return [e for e in read_journal(journal_path) if e["event"] == event]

        async def kernel_recorded() -> bool:
            return bool(journaled(recorded))

        await poll(kernel_recorded, what=f"the first agent to journal the kernel's {recorded}")
        # SIGKILL: nothing more is recorded or sent.
        journal.dead = fault.dead = True
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        journal.close()
        (kernel,) = await cluster.kernels(sid)
        assert kernel["status"] == K.CREATING  # the manager never heard it run

        journal = Journal(journal_path)
        journal.write(JournalEvent.BOOT)
        client = HttpManagerClient(cluster.manager.url)
        again = _daemon(data_dir, client, SimulatedRuntime(profile, journal=journal))
        running = asyncio.create_task(again.run())
        try:
            row = await cluster.wait_status(sid)
        finally:
            await again.stop()
            await running
            journal.close()
        assert row["status"] == status, row
        (kernel,) = await cluster.kernels(sid)
        assert kernel["failure_cause"] == cause
        assert len(journaled(JournalEvent.START)) == 1  # never a second start for the placement
