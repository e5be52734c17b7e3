"""The agent protocol without HTTP: the manager's controller called directly, answering as the
HTTP routes would (their statuses, their errors).

`corral simulate` answers its thousands of agents this way, at the manager's end of their pipe
(`bench/agent_pipe.py`); they go through the same controller, and so the same store
operations, validation and hints, as agents calling the HTTP routes.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import (
    AssignmentMessage,
    HeartbeatResponse,
    KernelReportMessage,
    LogChunkMessage,
    OutputMessage,
    RegisterRequest,
    RegisterResponse,
    ReportAccepted,
)
from corral.controller._assignment_polls import PollsClosedError
from corral.controller.agents import AgentAuthError, AgentController, UnknownAgentError
from corral.domain.types import AgentId, KernelId
from corral.manager.wire import (
    assignment_message,
    kernel_reports,
    log_chunks,
    output_blobs,
    register_response,
    report_accepted,
)
from corral.store.kernel_logs import UploadRefusedError

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _as_over_http(call: str) -> Iterator[None]:
    """An error of the manager's own is what an agent over HTTP gets as a 500: logged here
    (the API's error handler would have), then `ManagerUnavailableError`, on which the agent
    backs off and tries again. Before, it reached the agent as it was and ended the agent's
    loops, so a transient database error (a deadlock the database broke) killed the agent."""
    try:
        yield
    except (ManagerRejectedError, ManagerUnavailableError):
        raise
    except Exception as exc:
        logger.exception("agent_api.internal_error", extra={"call": call})
        raise ManagerUnavailableError(f"{call}: internal error ({type(exc).__name__})") from exc


class InProcessManagerClient:
    """A ManagerClient that calls an AgentController directly (one per agent)."""

    def __init__(self, controller: AgentController) -> None:
        self._controller = controller

    async def register(self, request: RegisterRequest, token: str) -> RegisterResponse:
        """Register through the controller (the same token rules as over HTTP)."""
        with _as_over_http("register"):
            try:
                registration = await self._controller.register(
                    token,
                    AgentId(request.agent_id),
                    address=request.address,
                    slots=request.slots,
                    resource_group=request.resource_group,
                    labels=dict(request.labels),
                    runtime=request.runtime,
                )
            except AgentAuthError as exc:
                raise ManagerRejectedError(401, {"detail": str(exc)}) from exc
            return register_response(registration, self._controller.timings)

    async def heartbeat(self, agent_id: str) -> HeartbeatResponse:
        """Heartbeat through the controller."""
        with _as_over_http("heartbeat"):
            try:
                return HeartbeatResponse(status=await self._controller.heartbeat(AgentId(agent_id)))
            except UnknownAgentError as exc:
                raise ManagerRejectedError(404, {"detail": str(exc)}) from exc

    async def assignment(
        self, agent_id: str, since: int | None, wait_s: float
    ) -> AssignmentMessage:
        """The assignment, long-polling like the HTTP route."""
        with _as_over_http("assignment"):
            try:
                found = await self._controller.assignment(AgentId(agent_id), since, wait_s)
            except UnknownAgentError as exc:
                raise ManagerRejectedError(404, {"detail": str(exc)}) from exc
            except PollsClosedError as exc:
                raise ManagerUnavailableError(str(exc)) from exc
            return assignment_message(found)

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """Apply reports; the answer names the refused ones, as over HTTP."""
        with _as_over_http("report"):
            outcome = await self._controller.report(AgentId(agent_id), kernel_reports(reports))
            return report_accepted(outcome)

    async def upload_logs(self, agent_id: str, chunks: list[LogChunkMessage]) -> None:
        """Store log chunks."""
        with _as_over_http("upload_logs"):
            try:
                await self._controller.upload_logs(AgentId(agent_id), log_chunks(chunks))
            except UploadRefusedError as exc:
                raise ManagerRejectedError(409, {"detail": str(exc)}) from exc

    async def upload_outputs(self, agent_id: str, outputs: list[OutputMessage]) -> None:
        """Store output files."""
        with _as_over_http("upload_outputs"):
            try:
                await self._controller.upload_outputs(AgentId(agent_id), output_blobs(outputs))
            except UploadRefusedError as exc:
                raise ManagerRejectedError(409, {"detail": str(exc)}) from exc

    async def fetch_upload(self, agent_id: str, kernel_id: uuid.UUID) -> bytes:
        """The kernel's upload, as the HTTP route answers it."""
        with _as_over_http("fetch_upload"):
            data = await self._controller.kernel_upload(AgentId(agent_id), KernelId(kernel_id))
            if data is None:
                raise ManagerRejectedError(404, {"detail": f"kernel {kernel_id} names no upload"})
            return data

    async def close(self) -> None:
        """Nothing to release."""
