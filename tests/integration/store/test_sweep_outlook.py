"""The sweep writes only when its outlook says something is due, and says when next (both
backends): `AgentController.sweep` over `store.sweep_outlook`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from corral.controller.agents import AgentController, AgentTimings
from corral.domain.status import KernelStatus
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database
from corral.store.kernel_reports import KernelReport, apply_kernel_reports
from corral.store.sweep_outlook import read_sweep_outlook
from tests.integration._statements import recorded_statements
from tests.integration.coordination._harness import Clock
from tests.integration.store._factories import NOW, add_agents, update_agents
from tests.integration.store.test_kernel_checks import running_kernel

K = KernelStatus
TIMEOUT_S = 30.0
RUNNING_QUIET_S = 600.0
TERMINATING_QUIET_S = 60.0


def controller(db: Database, clock: Clock) -> AgentController:
    return AgentController(
        db,
        MemoryHintBus(),
        join_token=None,
        timings=AgentTimings(
            heartbeat_timeout_s=TIMEOUT_S,
            running_quiet_s=RUNNING_QUIET_S,
            terminating_quiet_s=TERMINATING_QUIET_S,
        ),
        clock=clock,
    )


def writes(statements: list[str]) -> list[str]:
    """The statements that are not reads (nor a read transaction's BEGIN / COMMIT)."""
    return [s for s in statements if s.split()[0].upper() in {"UPDATE", "INSERT", "DELETE"}]


async def test_with_no_agent_the_sweep_only_reads_and_comes_back_a_timeout_later(
    db: Database,
) -> None:
    """Nothing ALIVE: one read, no write; the next look is a heartbeat timeout away (an
    agent joining now is lost then at the earliest)."""
    clock = Clock()
    agents = controller(db, clock)
    with recorded_statements(db) as statements:
        swept = await agents.sweep()
    assert writes(statements) == []
    assert (swept.lost.agent_ids, swept.checks.asked, swept.checks.failed) == ([], {}, {})
    assert swept.due_in_s == TIMEOUT_S


async def test_an_agent_is_lost_when_its_silence_passes_the_timeout_and_not_before(
    db: Database,
) -> None:
    """The due moment follows the oldest heartbeat; before it the sweep writes nothing, at it
    the agent is LOST, and the next look comes at once (rows moved)."""
    (agent,) = await add_agents(db, [{"cpu": 1000}])  # last heard from at NOW
    clock = Clock()
    agents = controller(db, clock)
    clock.advance(5)
    with recorded_statements(db) as statements:
        swept = await agents.sweep()
    assert writes(statements) == []
    assert swept.due_in_s == pytest.approx(TIMEOUT_S - 5)

    clock.advance(TIMEOUT_S - 5)  # exactly the timeout: not yet silent past it
    swept = await agents.sweep()
    assert swept.lost.agent_ids == []
    assert swept.due_in_s == AgentTimings(heartbeat_timeout_s=TIMEOUT_S).heartbeat_interval_s

    clock.advance(0.5)
    swept = await agents.sweep()
    assert swept.lost.agent_ids == [agent]
    assert swept.due_in_s == 0.0
    again = await agents.sweep()  # nothing ALIVE now
    assert again.lost.agent_ids == []
    assert again.due_in_s == TIMEOUT_S


async def test_a_fresh_heartbeat_moves_the_due_moment(db: Database) -> None:
    """Two agents: the older heartbeat sets the moment; once it heartbeats, the other's does."""
    first, second = await add_agents(db, [{"cpu": 1000}, {"cpu": 1000}])
    await update_agents(db, [second], last_heartbeat_at=NOW + timedelta(seconds=4))
    clock = Clock()
    agents = controller(db, clock)
    clock.advance(10)
    assert (await agents.sweep()).due_in_s == pytest.approx(TIMEOUT_S - 10)
    await agents.heartbeat(first)  # at NOW + 10
    assert (await agents.sweep()).due_in_s == pytest.approx(TIMEOUT_S - 10 + 4)


async def test_a_running_kernel_is_asked_about_at_its_quiet_moment_then_failed(
    db: Database,
) -> None:
    """A RUNNING kernel on an agent that keeps heartbeating: the sweep comes due at the
    kernel's quiet moment, asks, comes due again at the answer's bound, and fails it."""
    agent, kid, _ = await running_kernel(db)  # reported RUNNING at NOW
    clock = Clock()
    agents = controller(db, clock)
    outlook = await read_sweep_outlook(db)
    assert set(outlook.unasked) == {K.RUNNING}
    assert outlook.oldest_ask is None

    async def heartbeat_and_sweep(at_s: float) -> float:
        clock.now = NOW + timedelta(seconds=at_s)
        await agents.heartbeat(agent)
        swept = await agents.sweep()
        assert (swept.checks.asked, swept.checks.failed) == ({}, {})
        return swept.due_in_s

    # Heartbeats keep the agent's moment a timeout away; a kernel starting now would come
    # due TERMINATING_QUIET_S from now; the RUNNING one's moment is NOW + RUNNING_QUIET_S.
    assert await heartbeat_and_sweep(100) == pytest.approx(TIMEOUT_S)
    assert await heartbeat_and_sweep(RUNNING_QUIET_S - 10) == pytest.approx(10)

    clock.now = NOW + timedelta(seconds=RUNNING_QUIET_S + 0.5)
    await agents.heartbeat(agent)
    swept = await agents.sweep()
    assert swept.checks.asked == {kid: agent}
    assert swept.due_in_s == 0.0
    outlook = await read_sweep_outlook(db)
    assert outlook.oldest_ask == clock.now
    assert (await agents.sweep()).due_in_s == pytest.approx(TIMEOUT_S)

    clock.advance(TIMEOUT_S + 0.5)
    await agents.heartbeat(agent)
    swept = await agents.sweep()
    assert set(swept.checks.failed) == {kid}
    assert (await read_sweep_outlook(db)).unasked == {}


async def test_an_answered_kernel_is_not_due_before_its_answer_plus_the_bound(
    db: Database,
) -> None:
    """The agent's answer to an ask (its word of the kernel) moves the kernel's quiet moment:
    the sweep neither asks again nor comes due before the answer plus the bound."""
    agent, kid, _ = await running_kernel(db)
    clock = Clock()
    agents = controller(db, clock)
    clock.now = NOW + timedelta(seconds=RUNNING_QUIET_S + 1)
    await agents.heartbeat(agent)
    assert (await agents.sweep()).checks.asked == {kid: agent}
    answered_at = clock.now + timedelta(seconds=9)
    await apply_kernel_reports(db, agent, [KernelReport(kid, K.RUNNING)], answered_at)

    clock.now = answered_at + timedelta(seconds=RUNNING_QUIET_S - 10)
    await agents.heartbeat(agent)
    swept = await agents.sweep()
    assert swept.checks.asked == {}
    assert swept.due_in_s == pytest.approx(10)
    clock.now = answered_at + timedelta(seconds=RUNNING_QUIET_S + 0.5)
    await agents.heartbeat(agent)
    assert (await agents.sweep()).checks.asked == {kid: agent}
