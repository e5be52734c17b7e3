"""The kernel restart policy (issue 36) through the real coordinator, instant test agents and an
injected clock, on SQLite and PostgreSQL: a restart turns the session's KernelsReady condition
false (WaitForRecovery) and true again (Recovered), the recovery timeout evicts a kernel that
does not come back in time, and a restart report re-sent after a lost answer counts once."""

from __future__ import annotations

from typing import Any

from corral.domain.admission import KERNELS_READY_TIMEOUT, KernelsReadyReason
from corral.domain.events import SESSION_KERNEL_RESTARTING, SESSION_RECOVERED
from corral.domain.failure_causes import FailureCause
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import KernelId, SessionId
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.kernel_reports import PHASE_RESTART, KernelReport, apply_kernel_reports
from corral.store.resource_group_store import update_group
from corral.store.session_views import get_session
from tests.integration.coordination._harness import Cluster, make_cluster
from tests.integration.store._factories import assert_slots_consistent

S, K = SessionStatus, KernelStatus
CPU4 = {"cpu": 4000}
RECOVERY_S = 120


async def _enable(c: Cluster, **options: Any) -> None:
    wait = {"enable": True, "timeout_s": 300, **options}
    await update_group(c.db, "default", c.clock(), options_patch={"wait_for_kernels_ready": wait})


async def _row(c: Cluster, sid: SessionId) -> dict[str, Any]:
    found = await get_session(c.db, sid)
    assert found is not None
    return found


async def _running(c: Cluster, **fields: Any) -> tuple[SessionId, list[KernelId]]:
    """A 2-kernel multi-node session with a restart limit, RUNNING and ready."""
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node", restart_limit=2, **fields)
    await c.settle()
    row = await _row(c, sid)
    assert row["status"] == S.RUNNING.value and row["kernels_ready"] is True
    return sid, [KernelId(k["id"]) for k in row["kernels"]]


def _condition(row: dict[str, Any]) -> tuple[Any, Any]:
    return row["kernels_ready"], row["kernels_ready_reason"]


async def _kinds(c: Cluster, sid: SessionId) -> list[str]:
    events = await read_events(c.db, entity_id=str(sid))
    return [e.kind for e in events if not e.kind.startswith("session.status")]


async def test_a_kernel_that_restarts_within_the_recovery_timeout_keeps_the_session_admitted(
    db: Database,
) -> None:
    """Down: WaitForRecovery from that moment; back up before the timeout: Recovered, still
    RUNNING, never evicted; both changes in the session's history and events."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, recovery_timeout_s=RECOVERY_S)
    sid, (main, _) = await _running(c)
    c.clock.advance(30)
    await c.agent.restart([main], 1, restarting=True)
    row = await _row(c, sid)
    assert _condition(row) == (False, KernelsReadyReason.WAIT_FOR_RECOVERY.value)
    assert row["kernels_ready_at"] == c.clock()
    kernel = row["kernels"][0]
    assert (kernel["status"], kernel["restarts"], kernel["restarting"]) == ("RUNNING", 1, True)
    c.clock.advance(RECOVERY_S - 1)
    assert await c.run("EvictNotReady") == 0
    await c.agent.restart([main], 1, restarting=False)
    row = await _row(c, sid)
    assert _condition(row) == (True, KernelsReadyReason.RECOVERED.value)
    assert row["kernels_ready_at"] == c.clock()
    assert row["kernels"][0]["restarting"] is False
    c.clock.advance(RECOVERY_S * 10)
    assert await c.run("EvictNotReady") == 0
    assert await c.status(sid) is S.RUNNING
    assert await _kinds(c, sid) == ["session.created", SESSION_KERNEL_RESTARTING, SESSION_RECOVERED]
    restarts = [m for m in await c.moves_of(sid) if m[0] == PHASE_RESTART]
    assert restarts == [
        (PHASE_RESTART, "NEED_RETRY", "RUNNING", 1),
        (PHASE_RESTART, "SUCCESS", "RUNNING", 1),
    ]


async def test_past_the_recovery_timeout_a_restarting_session_is_evicted_with_wait_for_recovery(
    db: Database,
) -> None:
    """A kernel down longer than recovery_timeout_s: the session is evicted (KernelsReadyTimeout,
    cause WaitForRecovery), its slots released; placed again it runs, ready, not restarting."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, recovery_timeout_s=RECOVERY_S, requeuing={"backoff_base_s": 0})
    sid, (main, _) = await _running(c)
    await c.agent.restart([main], 1, restarting=True)
    c.clock.advance(RECOVERY_S)
    assert await c.run("EvictNotReady") == 1
    row = await _row(c, sid)
    assert row["status"] == S.PENDING.value
    assert (row["requeue_count"], row["eviction_reason"]) == (1, KERNELS_READY_TIMEOUT)
    assert KernelsReadyReason.WAIT_FOR_RECOVERY.value in row["status_info"]
    await assert_slots_consistent(db, c.agents, [sid])
    await c.settle()
    row = await _row(c, sid)
    assert row["status"] == S.RUNNING.value
    assert _condition(row) == (True, KernelsReadyReason.READY.value)
    assert [(k["restarts"], k["restarting"]) for k in row["kernels"]] == [(1, False), (0, False)]


async def test_with_no_recovery_timeout_a_restarting_kernel_never_evicts(db: Database) -> None:
    """Enabled without recovery_timeout_s: a session stays RUNNING however long a kernel is
    down."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c)
    sid, (main, _) = await _running(c)
    await c.agent.restart([main], 1, restarting=True)
    c.clock.advance(10**7)
    assert await c.run("EvictNotReady") == 0
    row = await _row(c, sid)
    assert row["status"] == S.RUNNING.value
    assert _condition(row) == (False, KernelsReadyReason.WAIT_FOR_RECOVERY.value)


async def test_the_session_recovers_only_once_every_restarting_kernel_runs_again(
    db: Database,
) -> None:
    """Two kernels down: one back up leaves the session not ready; the second makes it ready;
    the transition time stays that of the first kernel going down until then."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, recovery_timeout_s=RECOVERY_S)
    sid, kernels = await _running(c)
    down_at = c.clock()
    await c.agent.restart(kernels, 1, restarting=True)
    c.clock.advance(5)
    await c.agent.restart(kernels[:1], 1, restarting=False)
    row = await _row(c, sid)
    assert _condition(row) == (False, KernelsReadyReason.WAIT_FOR_RECOVERY.value)
    assert row["kernels_ready_at"] == down_at
    await c.agent.restart(kernels[1:], 1, restarting=False)
    assert _condition(await _row(c, sid)) == (True, KernelsReadyReason.RECOVERED.value)


async def test_a_restart_report_resent_after_a_lost_answer_counts_once(db: Database) -> None:
    """The same batch applied twice (its answer lost): the second is acknowledged as applied,
    one restart counted, one history row and one event of each kind."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, recovery_timeout_s=RECOVERY_S)
    sid, (main, _) = await _running(c)
    row = await _row(c, sid)
    agent = row["kernels"][0]["agent_id"]
    batch = [
        KernelReport(main, K.RUNNING, exit_code=1, restarts=1, restarting=True),
        KernelReport(main, K.RUNNING, restarts=1, restarting=False),
    ]
    first = await apply_kernel_reports(db, agent, batch, c.clock())
    assert set(first.restarted) == {main} and first.already == 0
    again = await apply_kernel_reports(db, agent, batch, c.clock())
    assert (again.restarted, again.already, again.refused) == ({}, 2, {})
    late = await apply_kernel_reports(db, agent, batch[:1], c.clock())  # an older one, late
    assert (late.restarted, late.already) == ({}, 1)
    row = await _row(c, sid)
    assert (row["kernels"][0]["restarts"], row["kernels"][0]["restarting"]) == (1, False)
    assert _condition(row) == (True, KernelsReadyReason.RECOVERED.value)
    assert await _kinds(c, sid) == ["session.created", SESSION_KERNEL_RESTARTING, SESSION_RECOVERED]


async def test_without_admission_enabled_restarts_are_counted_and_the_session_runs_on(
    db: Database,
) -> None:
    """The restart does not need wait_for_kernels_ready: counted, never evicted."""
    c = await make_cluster(db, [CPU4] * 2)
    sid, (main, _) = await _running(c)
    await c.agent.restart([main], 1, restarting=True)
    c.clock.advance(10**6)
    await c.settle()
    await c.agent.restart([main], 1, restarting=False)
    row = await _row(c, sid)
    assert row["status"] == S.RUNNING.value
    assert row["kernels"][0]["restarts"] == 1


async def test_past_the_limit_the_session_ends_as_without_restarts(db: Database) -> None:
    """A kernel restarted to its limit that then fails ends its session with the same status,
    result, failure cause and exit code as a session without the policy whose kernel fails."""
    c = await make_cluster(db, [CPU4] * 4)
    restarted, (main, _) = await _running(c)
    plain = await c.submit(cluster_size=2, cluster_mode="multi-node")
    await c.settle()
    plain_main = KernelId((await _row(c, plain))["kernels"][0]["id"])
    for n in (1, 2):
        await c.agent.restart([main], n, restarting=True)
        await c.agent.restart([main], n, restarting=False)
    for kernel in (main, plain_main):
        await c.agent.crash([kernel], FailureCause.KERNEL_NONZERO_EXIT)
    await c.settle()

    def ending(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["status"], row["result"], row["failure_cause"], row["exit_code"])

    assert ending(await _row(c, restarted)) == ending(await _row(c, plain))
    assert (await _row(c, restarted))["status"] in (S.TERMINATED.value, S.ERROR.value)


async def test_a_session_that_starts_running_while_a_kernel_restarts_is_not_ready(
    db: Database,
) -> None:
    """Its first kernel runs and goes down to be restarted while the second still starts: once
    the session runs it is not ready (WaitForRecovery) until that kernel runs again."""
    c = await make_cluster(db, [CPU4] * 2)
    await _enable(c, recovery_timeout_s=RECOVERY_S)
    sid = await c.submit(cluster_size=2, cluster_mode="multi-node", restart_limit=1)
    for _ in range(20):  # until both kernels are prepared and asked to run; the second hangs
        await c.coordinator.run_all()
        if await c.status(sid) is S.CREATING:
            break
        await c.agent.step()
    row = await _row(c, sid)
    first, second = row["kernels"]
    c.agent.unresponsive.add(second["agent_id"])
    await c.settle()
    assert await c.status(sid) is S.CREATING
    await c.agent.restart([KernelId(first["id"])], 1, restarting=True)
    c.agent.unresponsive.clear()
    await c.settle()
    row = await _row(c, sid)
    assert row["status"] == S.RUNNING.value
    assert _condition(row) == (False, KernelsReadyReason.WAIT_FOR_RECOVERY.value)
    await c.agent.restart([KernelId(first["id"])], 1, restarting=False)
    assert _condition(await _row(c, sid)) == (True, KernelsReadyReason.RECOVERED.value)
