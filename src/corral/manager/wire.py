"""Agent-protocol messages to and from the store's types, for every transport."""

from __future__ import annotations

from collections.abc import Sequence

from corral.agent.protocol import (
    AssignedKernelMessage,
    AssignmentMessage,
    KernelReportMessage,
    LogChunkMessage,
    OutputMessage,
    RegisterResponse,
    ReportAccepted,
)
from corral.controller.agents import AgentTimings, Registration
from corral.domain.types import KernelId
from corral.store.assignments import Assignment
from corral.store.kernel_logs import LogChunk, OutputBlob
from corral.store.kernel_reports import KernelReport, ReportOutcome


def assignment_message(assignment: Assignment) -> AssignmentMessage:
    """An assignment as the protocol carries it.

    Built without validation (`model_construct`): the values come from the store, already
    typed, and an agent of eight kernels is answered hundreds of times a second under load.
    """
    return AssignmentMessage.model_construct(
        agent_id=assignment.agent_id,
        revision=assignment.revision,
        kernels=[
            AssignedKernelMessage.model_construct(
                id=k.id,
                session_id=k.session_id,
                cluster_role=k.cluster_role,
                cluster_index=k.cluster_index,
                cluster_size=k.cluster_size,
                cluster_hosts=list(k.cluster_hosts),
                status=k.status,
                desired_state=k.desired_state,
                desired_generation=k.desired_generation,
                stage_failure=k.stage_failure,
                attempt=k.attempt,
                restarts=k.restarts,
                restarting=k.restarting,
                asked=k.asked,
                slots=dict(k.occupied_slots),
                spec=k.spec,
                array_number=k.array_number,
                array_index=k.array_index,
                owner=k.owner,
            )
            for k in assignment.kernels
        ],
    )


def report_accepted(outcome: ReportOutcome) -> ReportAccepted:
    """A report batch's answer: what was applied, acknowledged, and refused (per kernel)."""
    return ReportAccepted(
        applied=len(outcome.moved)
        + len(outcome.stage_failures)
        + len(outcome.restarted.keys() - outcome.moved.keys()),
        already=outcome.already,
        refused={str(k): why for k, why in outcome.refused.items()},
    )


def register_response(registration: Registration, timings: AgentTimings) -> RegisterResponse:
    """What a registered agent is told: who it is, its token if new, how often to speak."""
    return RegisterResponse(
        agent_id=registration.agent_id,
        token=registration.token,
        heartbeat_interval_s=timings.heartbeat_interval_s,
        heartbeat_timeout_s=timings.heartbeat_timeout_s,
        assignment_wait_s=timings.assignment_wait_s,
    )


def kernel_reports(messages: Sequence[KernelReportMessage]) -> list[KernelReport]:
    """Reports as the store applies them."""
    return [
        KernelReport(
            kernel_id=KernelId(m.kernel_id),
            status=m.status,
            exit_code=m.exit_code,
            failure_cause=m.failure_cause,
            message=m.message,
            runtime_info=m.runtime_info,
            stage_failed=m.stage_failed,
            attempt=m.attempt,
            restarts=m.restarts,
            restarting=m.restarting,
        )
        for m in messages
    ]


def log_chunks(messages: Sequence[LogChunkMessage]) -> list[LogChunk]:
    """Log chunks as the store keeps them."""
    return [LogChunk(KernelId(c.kernel_id), c.stream, c.offset, c.raw()) for c in messages]


def output_blobs(messages: Sequence[OutputMessage]) -> list[OutputBlob]:
    """Output files as the store keeps them."""
    return [OutputBlob(KernelId(o.kernel_id), o.name, o.raw()) for o in messages]
