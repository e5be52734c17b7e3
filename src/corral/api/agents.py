"""The agent protocol over HTTP: `/v1/agents/...`, each call authenticated by the agent's token."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from corral.agent.protocol import (
    AssignedKernelMessage,
    AssignmentMessage,
    HeartbeatResponse,
    LogBatch,
    OutputBatch,
    RegisterRequest,
    RegisterResponse,
    ReportAccepted,
    ReportBatch,
)
from corral.api._pages import json_without_unencodable
from corral.api.auth import bearer
from corral.api.problems import Problem
from corral.controller._assignment_polls import AssignmentsUnavailableError, PollsClosedError
from corral.controller.agents import (
    AgentAuthError,
    AgentController,
    AgentIdTakenError,
    UnknownAgentError,
)
from corral.controller.sessions import SessionController
from corral.domain.types import AgentId, KernelId, SessionId
from corral.manager.wire import (
    assignment_message,
    kernel_reports,
    log_chunks,
    output_blobs,
    register_response,
    report_accepted,
)
from corral.store.agent_registry import AgentCapacityError
from corral.store.kernel_logs import UploadRefusedError

# Tagged apart from the admins' `/v1/agents` routes (tag "agents"): what agents call, not users.
AGENT_PROTOCOL_TAG = "agent-protocol"
router = APIRouter(prefix="/v1/agents", tags=[AGENT_PROTOCOL_TAG])

MAX_WAIT_S = 120.0


async def controller(request: Request) -> AgentController:
    """The app's agent controller."""
    agents: AgentController = request.app.state.agents
    return agents


Controller = Annotated[AgentController, Depends(controller)]
Bearer = Annotated[str, Depends(bearer)]


async def authenticated(agent_id: str, agents: Controller, token: Bearer) -> AgentId:
    """The path's agent, when the bearer token is its own."""
    try:
        await agents.authenticate(AgentId(agent_id), token)
    except UnknownAgentError as exc:
        raise Problem(404, "agent-not-found", "No such agent", str(exc)) from exc
    except AgentAuthError as exc:
        raise Problem(401, "unauthenticated", "Not this agent's token", str(exc)) from exc
    return AgentId(agent_id)


Agent = Annotated[AgentId, Depends(authenticated)]


@router.post(
    "/register",
    response_model=RegisterResponse,
    responses={201: {"model": RegisterResponse, "description": "A new agent joined"}},
    operation_id="register_agent",
)
async def register(
    body: RegisterRequest, agents: Controller, token: Bearer, response: Response
) -> RegisterResponse:
    """Join the cluster (join token) or come back after a restart (the agent's own token)."""
    try:
        registration = await agents.register(
            token,
            AgentId(body.agent_id),
            address=body.address,
            slots=body.slots,
            resource_group=body.resource_group,
            labels=body.labels,
            runtime=body.runtime,
        )
    except AgentAuthError as exc:
        raise Problem(401, "unauthenticated", "Not allowed to register", str(exc)) from exc
    except AgentIdTakenError as exc:
        raise Problem(409, "agent-id-taken", "Agent id already registered", str(exc)) from exc
    except AgentCapacityError as exc:
        raise Problem(409, "agent-capacity-conflict", "Capacity below use", str(exc)) from exc
    if registration.created:
        response.status_code = 201
    return register_response(registration, agents.timings)


@router.post(
    "/{agent_id}/heartbeat", response_model=HeartbeatResponse, operation_id="agent_heartbeat"
)
async def heartbeat(agent_id: Agent, agents: Controller) -> HeartbeatResponse:
    """I am alive; the answer says whether the manager still counts on me."""
    return HeartbeatResponse(status=await agents.heartbeat(agent_id))


@router.get(
    "/{agent_id}/assignments",
    response_model=AssignmentMessage,
    operation_id="get_agent_assignments",
)
async def assignments(
    request: Request,
    agent_id: Agent,
    agents: Controller,
    since: Annotated[int | None, Query(ge=0)] = None,
    wait: Annotated[float | None, Query(ge=0, le=MAX_WAIT_S)] = None,
) -> Response:
    """The agent's full desired state; with `since`, waits until it differs from that revision."""
    wait_s = agents.timings.assignment_wait_s if wait is None else wait
    try:
        assignment = await agents.assignment(agent_id, since, wait_s)
    except PollsClosedError as exc:
        raise Problem(503, "manager-stopping", "The manager is stopping", str(exc)) from exc
    except AssignmentsUnavailableError as exc:
        raise Problem(503, "database-unavailable", "The database is unavailable", str(exc)) from exc
    message = assignment_message(assignment)

    def answer(kernels: list[AssignedKernelMessage]) -> AssignmentMessage:
        return message.model_copy(update={"kernels": kernels})

    body, unencodable = json_without_unencodable(message.kernels, answer)
    poisoned = dict(assignment.unreadable)
    poisoned.update(
        (SessionId(k.session_id), "the stored session holds text that cannot be encoded")
        for k in unencodable
    )
    if poisoned:
        # The agent gets the rest of its work now; those sessions end, and its next poll no
        # longer meets them (its revision moved with their kernels).
        sessions: SessionController = request.app.state.sessions
        await sessions.quarantine.isolate(poisoned, where=f"assignments of agent {agent_id}")
    return Response(body, media_type="application/json")


@router.post(
    "/{agent_id}/reports", response_model=ReportAccepted, operation_id="send_agent_reports"
)
async def reports(agent_id: Agent, body: ReportBatch, agents: Controller) -> ReportAccepted:
    """Kernel progress, in order; each report applied as far as it is legal. A re-sent or
    passed status is acknowledged as already applied; an impossible one is refused alone,
    named in `refused` (the batch's other reports are applied)."""
    return report_accepted(await agents.report(agent_id, kernel_reports(body.reports)))


@router.post("/{agent_id}/logs", status_code=204, operation_id="send_agent_logs")
async def logs(agent_id: Agent, body: LogBatch, agents: Controller) -> Response:
    """Log chunks of the agent's kernels; re-sent chunks are ignored."""
    try:
        await agents.upload_logs(agent_id, log_chunks(body.chunks))
    except UploadRefusedError as exc:
        raise Problem(409, "not-agents-kernel", "Upload refused", str(exc)) from exc
    return Response(status_code=204)


@router.get(
    "/{agent_id}/kernels/{kernel_id}/upload",
    response_class=Response,
    responses={200: {"content": {"application/gzip": {}}, "description": "the upload, tar.gz"}},
    operation_id="get_kernel_upload",
)
async def kernel_upload(agent_id: Agent, kernel_id: uuid.UUID, agents: Controller) -> Response:
    """The upload a kernel of this agent unpacks before it starts (its session's `upload`)."""
    data = await agents.kernel_upload(agent_id, KernelId(kernel_id))
    if data is None:
        raise Problem(
            404,
            "upload-not-found",
            "No such upload",
            f"kernel {kernel_id} is not placed on agent {agent_id}, or names no upload",
        )
    return Response(data, media_type="application/gzip")


@router.post("/{agent_id}/outputs", status_code=204, operation_id="send_agent_outputs")
async def outputs(agent_id: Agent, body: OutputBatch, agents: Controller) -> Response:
    """Output files of the agent's kernels."""
    try:
        await agents.upload_outputs(agent_id, output_blobs(body.outputs))
    except UploadRefusedError as exc:
        raise Problem(409, "not-agents-kernel", "Upload refused", str(exc)) from exc
    return Response(status_code=204)
