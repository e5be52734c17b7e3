"""Schemathesis against the app's own `/openapi.json`: no 5xx, and every answer as documented.

Each operation gets schemathesis' coverage cases (deterministic boundary values, missing and
malformed parameters, unexpected methods), then a bounded number of derandomized Hypothesis
examples, valid and invalid. Hypothesis runs in a worker thread while the app serves on the
test's event loop (its database pool and long-poll task live there), so each request crosses
back with `run_coroutine_threadsafe`. Generated ids rarely exist, so path parameters are also
drawn from a few seeded resources, whose requests are checked too. Streams are kept out: events
and logs are read with `follow=false`, and agents' long polls with `wait=0`. An exception the app
raises (a 500 to a real client) fails the test like a 5xx.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
import schemathesis
import schemathesis.generation.hypothesis as schemathesis_hypothesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, Case, CheckFunction, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.errors import FailureGroup
from schemathesis.generation.meta import CoveragePhaseData
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.schemas import OpenApiSchema

from tests.integration.api.conftest import JOIN, ApiWorld, Caller

EXAMPLES = 12  # per operation and generation mode (with the coverage cases of each)
REQUEST_TIMEOUT_S = 10.0
BASE_URL = "http://manager"
PROBLEM_MEDIA_TYPE = "application/problem+json"
AGENT_ID = "fuzz-agent"
CHECKS: list[CheckFunction] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# What keeps a request from streaming or long-polling, by operation.
NO_STREAM: dict[str, dict[str, str]] = {
    "GET /v1/events": {"follow": "false"},
    "GET /v1/sessions/{session_id}/logs": {"follow": "false"},
    "GET /v1/agents/{agent_id}/assignments": {"wait": "0"},
}
# The test app runs no coordinator loops, so readiness is a documented 503 by design.
SKIPPED = {"GET /readyz"}
# What schemathesis' `setup()` replaces in Hypothesis for the whole process (a printer that prints
# nothing, larger buffers): restored after each test, so later property tests report their
# falsifying examples as usual. pyproject keeps its pytest plugin, which patches at start, off.
HYPOTHESIS_PATCHED = [
    ("hypothesis.core", "RepresentationPrinter"),
    ("hypothesis.core", "BUFFER_SIZE"),
    ("hypothesis.internal.conjecture.engine", "BUFFER_SIZE"),
    ("hypothesis.strategies._internal.collections", "BUFFER_SIZE"),
    ("hypothesis.strategies._internal.core", "is_first_param_referenced_in_function"),
    ("hypothesis.internal.entropy", "register_random"),
]
T = TypeVar("T")
# Every operation of the API is exercised, each in a few seconds: the whole takes 80 to 110 s
# on a busy shared machine, past the suite's default per-test timeout as operations are added.
pytestmark = pytest.mark.timeout(300)


@dataclass(frozen=True)
class Seeded:
    """Resources made before fuzzing, whose ids are drawn for path parameters."""

    sessions: list[str]
    agent_token: str
    groups: list[str]
    users: list[str]
    spare_token: str  # a token of bob's that a DELETE may revoke


async def test_admin_gets_documented_answers(world: ApiWorld) -> None:
    """As an admin, generated requests to every operation get no 5xx and documented answers."""
    schema = await _schema(world)
    await _exercise(world, schema, world.admin, await _seed(world, schema))


async def test_plain_user_gets_documented_answers(world: ApiWorld) -> None:
    """As a plain user too: admin routes and others' sessions answer documented problems."""
    schema = await _schema(world)
    await _exercise(world, schema, world.alice, await _seed(world, schema))


async def _schema(world: ApiWorld) -> OpenApiSchema:
    document = await world.http.get("/openapi.json")
    assert document.status_code == 200, document.text
    schema = schemathesis.openapi.from_dict(document.json())
    # Unknown query parameters are ignored, as by most HTTP APIs: not a rejection to demand.
    schema.config.generation.update(allow_extra_parameters=False)
    return schema


async def _seed(world: ApiWorld, schema: OpenApiSchema) -> Seeded:
    async def call(
        label: str, caller: Caller | str, body: Any = None, **path: str
    ) -> dict[str, Any]:
        method, template = label.split(" ", 1)
        token = caller if isinstance(caller, str) else _token(caller)
        with_body: dict[str, Any] = {} if body is None else {"body": body}
        case = schema[template][method].Case(
            path_parameters=path, headers={"authorization": f"Bearer {token}"}, **with_body
        )
        response = await world.http.request(**_request(case))
        _validate(case, response)
        assert response.is_success, response.text
        answer: dict[str, Any] = response.json()
        return answer

    # Each valid generated array is created: ten thousand sessions an example would be the
    # whole test's time, and the limit is tested on its own (test_arrays_api).
    world.cluster.controller.max_array_size = 10
    spec = {"image": "python", "command": ["true"], "resources": {"cpu": 1}}
    once = {**spec, "creation_id": "seed-1"}
    sessions = [
        (await call("POST /v1/sessions", world.alice, spec))["id"],
        (await call("POST /v1/sessions", world.admin, once))["id"],
        (await call("POST /v1/sessions", world.alice, spec))["id"],
    ]
    assert (await call("POST /v1/sessions", world.admin, once))["id"] == sessions[1]  # 200
    ended = await call(
        "POST /v1/sessions/{session_id}/terminate", world.alice, session_id=sessions[2]
    )
    assert ended["status"] == "CANCELLED", ended
    joined = await call(
        "POST /v1/agents/register",
        JOIN,
        {"agent_id": AGENT_ID, "address": "10.0.0.9", "slots": {"cpu": 4, "mem": "8g"}},
    )
    await call("POST /v1/resource-groups", world.admin, {"name": "fuzz"})
    spare = await call("POST /v1/users/{name}/tokens", world.admin, {"name": "spare"}, name="bob")
    return Seeded(
        sessions=sessions,
        agent_token=joined["token"],
        groups=["default", "fuzz"],
        users=[world.alice.user.name, world.admin.user.name],
        spare_token=spare["id"],
    )


async def _exercise(world: ApiWorld, schema: OpenApiSchema, caller: Caller, seeded: Seeded) -> None:
    loop = asyncio.get_running_loop()

    def on_loop(coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def send(case: Case) -> httpx.Response:
        return on_loop(asyncio.wait_for(world.http.request(**_request(case)), REQUEST_TIMEOUT_S))

    plans = [
        _plan(operation, caller, seeded)
        for result in schema.get_all_operations()
        if (operation := result.ok()).label not in SKIPPED
    ]
    with _hypothesis_restored():
        failures = await asyncio.to_thread(
            lambda: [
                failure
                for plan in plans
                for failure in (
                    _cover(schema, plan, send),
                    *(_fuzz_examples(plan, mode, send) for mode in GenerationMode),
                )
                if failure is not None
            ]
        )
    assert not failures, "\n\n".join(failures)


@contextmanager
def _hypothesis_restored() -> Iterator[None]:
    """Hypothesis as it was before, once schemathesis has patched it (see HYPOTHESIS_PATCHED)."""
    missing = object()
    saved = [
        (module, name, getattr(module, name, missing))
        for module, name in (
            (importlib.import_module(path), name) for path, name in HYPOTHESIS_PATCHED
        )
    ]
    try:
        yield
    finally:
        for module, name, value in saved:
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)
        schemathesis_hypothesis.setup._is_patched = False  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Plan:
    """How one operation is called: fixed headers and query, and seeded path values to try."""

    operation: APIOperation
    headers: dict[str, str]
    query: dict[str, str]
    seeded_paths: list[dict[str, str]]

    def strategy_kwargs(self) -> list[dict[str, Any]]:
        """Keyword sets for `as_strategy`: generated path values, then each seeded one."""
        base: dict[str, Any] = {"headers": self.headers, "query": self.query or None}
        return [base] + [{**base, "path_parameters": path} for path in self.seeded_paths]


def _token(caller: Caller) -> str:
    return caller.headers["Authorization"].removeprefix("Bearer ")


def _plan(operation: APIOperation, caller: Caller, seeded: Seeded) -> Plan:
    path = operation.path
    if path == "/v1/agents/register":
        token = JOIN
    elif path.startswith("/v1/agents/{agent_id}/") and not path.endswith("drain"):
        token = seeded.agent_token
    else:
        token = _token(caller)
    known: dict[str, list[str]] = {
        "session_id": seeded.sessions,
        "agent_id": [AGENT_ID],
        "token_id": [seeded.spare_token],
        "name": seeded.users if path.startswith("/v1/users") else seeded.groups,
    }
    return Plan(
        operation=operation,
        headers={"authorization": f"Bearer {token}"},
        query=NO_STREAM.get(operation.label, {}),
        seeded_paths=[
            {p.name: value} for p in operation.path_parameters for value in known.get(p.name, [])
        ],
    )


def _cover(schema: OpenApiSchema, plan: Plan, send: Callable[[Case], httpx.Response]) -> str | None:
    """Schemathesis' deterministic coverage cases of one operation; the first failure, or None."""
    fixed = {name.lower() for name in (*plan.headers, *plan.query)}
    cases = schema.iter_coverage_cases(
        plan.operation,
        generation_modes=list(GenerationMode),
        generation_config=schema.config.generation,
    )
    for case in cases:
        data = case.meta.phase.data if case.meta is not None else None
        if isinstance(data, CoveragePhaseData) and (data.parameter or "").lower() in fixed:
            continue  # a scenario about a value this test pins (auth, no streaming)
        case.headers.update(plan.headers)
        case.query = {**(case.query or {}), **plan.query}
        path = case.meta.components.get(ParameterLocation.PATH) if case.meta else None
        if plan.seeded_paths and (path is None or path.mode.is_positive):
            # Valid path values reach the existing resource, where the other values matter.
            case.path_parameters = {**(case.path_parameters or {}), **plan.seeded_paths[0]}
        try:
            _validate(case, send(case))
        except (Exception, FailureGroup) as exc:  # FailureGroup is a BaseExceptionGroup
            return f"{plan.operation.label} (coverage): {type(exc).__name__}: {exc}"
    return None


def _fuzz_examples(
    plan: Plan, mode: GenerationMode, send: Callable[[Case], httpx.Response]
) -> str | None:
    """Bounded, derandomized Hypothesis examples of one operation; what failed, or None."""
    strategy = st.one_of(
        [plan.operation.as_strategy(generation_mode=mode, **kw) for kw in plan.strategy_kwargs()]
    )

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],  # no shrinking: the failing case is printed as it was
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=strategy)
    def run(case: Case) -> None:
        _validate(case, send(case))

    try:
        run()
    except Unsatisfiable as exc:
        if mode is GenerationMode.NEGATIVE:
            return None  # nothing of this operation can be made invalid (string ids, no body)
        return f"{plan.operation.label} ({mode.value}): no valid request: {exc}"
    except (Exception, FailureGroup) as exc:  # FailureGroup is a BaseExceptionGroup
        return f"{plan.operation.label} ({mode.value}): {type(exc).__name__}: {exc}"
    return None


def _validate(case: Case, response: httpx.Response) -> None:
    """The answer is documented, and every 4xx is a problem-details document (RFC 9457)."""
    case.validate_response(response, checks=CHECKS)
    if not 400 <= response.status_code < 500:
        return
    where = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text}"
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE, where
    body = response.json()
    assert isinstance(body, dict), where
    assert body.get("status") == response.status_code, where
    for key in ("type", "title", "detail"):
        assert isinstance(body.get(key), str) and body[key], where


def _request(case: Case) -> dict[str, Any]:
    """httpx keyword arguments for the case (schemathesis serializes for `requests`)."""
    sent = case.as_transport_kwargs(base_url=BASE_URL)
    assert not sent.get("cookies") and not sent.get("files"), sent
    request: dict[str, Any] = {
        "method": sent["method"],
        "url": sent["url"],
        "params": sent.get("params"),
        "headers": sent.get("headers"),
    }
    if "json" in sent:
        request["json"] = sent["json"]
    elif "data" in sent:
        request["content"] = sent["data"]
    return request
