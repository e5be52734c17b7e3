"""The in-process agent transport answers as HTTP would: 4xx refusals, 5xx for the rest."""

from __future__ import annotations

import logging
from typing import cast

import pytest

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.controller.agents import AgentController, UnknownAgentError
from corral.manager.inprocess import InProcessManagerClient


class BrokenController:
    """Stands in for AgentController: its heartbeat fails with the given error."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def heartbeat(self, agent_id: str) -> str:
        raise self.error


def client(error: Exception) -> InProcessManagerClient:
    return InProcessManagerClient(cast(AgentController, BrokenController(error)))


async def test_an_error_of_the_manager_reaches_the_agent_as_a_retryable_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a 500 would be over HTTP (the agent backs off and tries again), logged with its
    traceback on the manager's side; not the raw error, which ended the agent's loops."""
    with (
        caplog.at_level(logging.ERROR, logger="corral.manager.inprocess"),
        pytest.raises(ManagerUnavailableError, match=r"heartbeat: internal error"),
    ):
        await client(RuntimeError("deadlock detected")).heartbeat("a-1")
    assert "agent_api.internal_error" in caplog.text
    assert "deadlock detected" in caplog.text


async def test_a_refusal_stays_a_refusal() -> None:
    with pytest.raises(ManagerRejectedError) as refused:
        await client(UnknownAgentError("no agent a-1")).heartbeat("a-1")
    assert refused.value.status == 404
