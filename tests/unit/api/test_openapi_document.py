"""The OpenAPI document clients generate from: its names are pinned, so none changes unnoticed.

A renamed operation id or schema breaks every generated client; a change here is a deliberate
one, made in this table too.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from corral.api.agents import AGENT_PROTOCOL_TAG
from corral.api.app import ApiContext, create_app
from corral.api.auth import BEARER_SCHEME

# (method, path) -> operation id, for every operation of the document.
OPERATION_IDS = {
    ("POST", "/v1/agents/register"): "register_agent",
    ("POST", "/v1/agents/{agent_id}/heartbeat"): "agent_heartbeat",
    ("GET", "/v1/agents/{agent_id}/assignments"): "get_agent_assignments",
    ("POST", "/v1/agents/{agent_id}/reports"): "send_agent_reports",
    ("POST", "/v1/agents/{agent_id}/logs"): "send_agent_logs",
    ("GET", "/v1/agents/{agent_id}/kernels/{kernel_id}/upload"): "get_kernel_upload",
    ("POST", "/v1/agents/{agent_id}/outputs"): "send_agent_outputs",
    ("GET", "/v1/agents"): "list_agents",
    ("GET", "/v1/agents/{agent_id}"): "get_agent",
    ("DELETE", "/v1/agents/{agent_id}"): "delete_agent",
    ("POST", "/v1/agents/{agent_id}/drain"): "drain_agent",
    ("POST", "/v1/agents/{agent_id}/undrain"): "undrain_agent",
    ("POST", "/v1/sessions"): "create_session",
    ("GET", "/v1/sessions"): "list_sessions",
    ("GET", "/v1/sessions/{session_id}"): "get_session",
    ("DELETE", "/v1/sessions/{session_id}"): "delete_session",
    ("GET", "/v1/sessions/{session_id}/attempts"): "list_session_attempts",
    ("POST", "/v1/sessions/{session_id}/terminate"): "terminate_session",
    ("POST", "/v1/sessions/{session_id}/activate"): "activate_session",
    ("GET", "/v1/sessions/{session_id}/history"): "get_session_history",
    ("GET", "/v1/sessions/{session_id}/explain"): "explain_session",
    ("GET", "/v1/sessions/{session_id}/logs"): "get_session_logs",
    ("POST", "/v1/arrays"): "create_array",
    ("GET", "/v1/arrays/{array}"): "get_array",
    ("DELETE", "/v1/arrays/{array}"): "delete_array",
    ("POST", "/v1/arrays/{array}/terminate"): "terminate_array",
    ("GET", "/v1/sessions/{session_id}/outputs"): "list_session_outputs",
    ("GET", "/v1/sessions/{session_id}/outputs/archive"): "download_session_outputs",
    ("GET", "/v1/sessions/{session_id}/outputs/{kernel}/{name}"): "download_session_output",
    ("GET", "/v1/uploads/{digest}"): "get_upload",
    ("PUT", "/v1/uploads/{digest}"): "put_upload",
    ("GET", "/v1/resource-groups"): "list_resource_groups",
    ("POST", "/v1/resource-groups"): "create_resource_group",
    ("GET", "/v1/resource-groups/{name}"): "get_resource_group",
    ("PATCH", "/v1/resource-groups/{name}"): "update_resource_group",
    ("DELETE", "/v1/resource-groups/{name}"): "delete_resource_group",
    ("GET", "/v1/retries"): "get_retries",
    ("PUT", "/v1/retries"): "set_retries",
    ("GET", "/v1/me"): "get_me",
    ("GET", "/v1/users"): "list_users",
    ("POST", "/v1/users"): "create_user",
    ("PATCH", "/v1/users/{name}"): "update_user",
    ("DELETE", "/v1/users/{name}"): "delete_user",
    ("GET", "/v1/users/{name}/tokens"): "list_user_tokens",
    ("POST", "/v1/users/{name}/tokens"): "create_user_token",
    ("DELETE", "/v1/tokens/{token_id}"): "revoke_token",
    ("GET", "/v1/events"): "list_events",
    ("POST", "/v1/deployments"): "create_deployment",
    ("GET", "/v1/deployments"): "list_deployments",
    ("GET", "/v1/deployments/{deployment}"): "get_deployment",
    ("DELETE", "/v1/deployments/{deployment}"): "destroy_deployment",
    ("POST", "/v1/deployments/{deployment}/scale"): "scale_deployment",
    ("POST", "/v1/deployments/{deployment}/update"): "update_deployment",
    ("GET", "/v1/deployments/{deployment}/history"): "get_deployment_history",
    ("POST", "/v1/deployments/{deployment}/token"): "rotate_deployment_token",
    ("GET", "/v1/serving/routes"): "get_route_table",
    ("POST", "/v1/serving/load"): "report_proxy_load",
}
# Every schema, by the name a generated client gives its type. A model whose input and output
# schemas differ (defaults filled in on the way out) has both, as `-Input` and `-Output`.
SCHEMA_NAMES = {
    "Autoscaling",
    "DeploymentHistory",
    "ProxyReport",
    "ServingHistoryEntry",
    "ServingLoad",
    "DeploymentAccess",
    "DeploymentCreated",
    "DeploymentList",
    "DeploymentOut",
    "DeploymentToken",
    "DeploymentScale",
    "DeploymentSpec",
    "DeploymentUpdate",
    "EndpointLifecycle",
    "HealthCheck",
    "RouteOut",
    "RouteStatus",
    "RouteTable",
    "RouteTableEntry",
    "ActivateOut",
    "AgentOut",
    "AgentPage",
    "ArrayElementOut",
    "ArrayElementState",
    "ArrayOut",
    "ArrayRemoveOut",
    "ArraySpec",
    "ArrayTerminateOut",
    "ArrayView",
    "AssignedKernelMessage",
    "AssignmentMessage",
    "AttemptOut",
    "AttemptsOut",
    "BackoffStrategy",
    "ClusterMode",
    "Dependency",
    "DependencyKind",
    "DependencyOut",
    "EventOut",
    "EventPage",
    "ExplanationOut",
    "HeartbeatResponse",
    "HistoryEntry",
    "HistoryOut",
    "IssuedTokenOut",
    "JitterMode",
    "KernelIntent",
    "KernelsReadyReason",
    "KernelOut",
    "KernelReportMessage",
    "KernelStatus",
    "LogBatch",
    "LogChunkMessage",
    "Me",
    "Ordering",
    "OutputBatch",
    "OutputFileOut",
    "OutputMessage",
    "OutputsOut",
    "PhaseLimitOptions",
    "RegisterRequest",
    "RegisterResponse",
    "ReportAccepted",
    "ReportBatch",
    "RequeuingOptions",
    "RequeuingTimestamp",
    "ResourceGroupCreate",
    "ResourceGroupOptions-Input",
    "ResourceGroupOptions-Output",
    "ResourceGroupOut",
    "ResourceGroupPage",
    "ResourceGroupPatch",
    "RetriesChange",
    "RetriesOut",
    "RetryDecision",
    "RetryEligibleCause",
    "RetryPolicy-Input",
    "RetryPolicy-Output",
    "Selector",
    "Sequencer",
    "SessionOut",
    "SessionPage",
    "SessionResult",
    "SessionSpec",
    "SessionStatus",
    "SessionType",
    "TerminateOut",
    "TokenCreate",
    "TokenOut",
    "TokenPage",
    "UploadOut",
    "UserCreate",
    "UserOut",
    "UserPage",
    "UserPatch",
    "WaitForKernelsReady",
}
SNAKE_CASE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    # Building the document touches none of the context: no database, no controllers.
    context = ApiContext(db=None, agents=None, sessions=None)  # type: ignore[arg-type]
    openapi: dict[str, Any] = create_app(context).openapi()
    return openapi


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }


def test_every_operation_has_its_pinned_snake_case_id(document: dict[str, Any]) -> None:
    ids = {key: op["operationId"] for key, op in _operations(document).items()}
    assert ids == OPERATION_IDS
    assert all(SNAKE_CASE.fullmatch(i) for i in ids.values()), ids
    assert len(set(ids.values())) == len(ids)


def test_schemas_keep_their_names(document: dict[str, Any]) -> None:
    names = set(document["components"]["schemas"])
    assert names == SCHEMA_NAMES
    # No generic parameters in a name (`Page_AgentOut_`): each page is a model of its own.
    assert not [n for n in names if not re.fullmatch(r"[A-Z][A-Za-z0-9]*(-Input|-Output)?", n)]


def test_authentication_is_a_bearer_security_scheme(document: dict[str, Any]) -> None:
    scheme = BEARER_SCHEME.scheme_name
    assert document["components"]["securitySchemes"][scheme] == {
        "type": "http",
        "scheme": "bearer",
        "description": BEARER_SCHEME.model.description,
    }
    for key, operation in _operations(document).items():
        assert operation["security"] == [{scheme: []}], key
        headers = [p for p in operation.get("parameters", []) if p["in"] == "header"]
        assert not headers, key


def test_every_field_of_the_session_spec_is_described(document: dict[str, Any]) -> None:
    properties = document["components"]["schemas"]["SessionSpec"]["properties"]
    assert [name for name, field in properties.items() if not field.get("description")] == []


def test_the_agent_protocol_is_tagged_apart(document: dict[str, Any]) -> None:
    for (method, path), operation in _operations(document).items():
        protocol = OPERATION_IDS[(method, path)] in {
            "register_agent",
            "agent_heartbeat",
            "get_agent_assignments",
            "send_agent_reports",
            "send_agent_logs",
            "get_kernel_upload",
            "send_agent_outputs",
        }
        assert (operation["tags"] == [AGENT_PROTOCOL_TAG]) == protocol, (method, path)


def test_the_event_stream_is_documented_as_server_sent_events(document: dict[str, Any]) -> None:
    content = document["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/EventPage"}
    stream = content["text/event-stream"]
    assert stream["schema"]["type"] == "string"
    assert "Last-Event-ID" in stream["schema"]["description"]
    assert stream["example"].startswith("id: 42\nevent: session.status_changed\ndata: {")
