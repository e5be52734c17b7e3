"""The SDK client against an in-memory API: requests, typed results, errors, pagination, streams."""

from __future__ import annotations

import re
import uuid
from contextlib import aclosing
from decimal import Decimal

import httpx
import pytest

from corral.client import (
    AuthError,
    Client,
    ClientConfigError,
    ConflictError,
    CorralError,
    NotFoundError,
    ServerError,
    UnreachableError,
    ValidationError,
)
from corral.domain.spec import SessionSpec
from corral.domain.status import KernelStatus, SessionStatus
from tests.unit.client._fake_api import TOKEN, URL, FakeApi, agent_json, problem


def _answering(response: httpx.Response) -> Client:
    return Client(URL, TOKEN, transport=httpx.MockTransport(lambda request: response))


def _raising(error: Exception) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    return Client(URL, TOKEN, transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, ValidationError),
        (401, AuthError),
        (403, AuthError),
        (404, NotFoundError),
        (409, ConflictError),
        (418, CorralError),
        (422, ValidationError),
        (500, ServerError),
        (503, ServerError),
    ],
)
async def test_problem_details_raise_the_exception_of_their_status(
    status: int, error_type: type[CorralError]
) -> None:
    """Each error status maps to its exception class, carrying the problem's fields."""
    async with _answering(problem(status, "some-problem", "what went wrong")) as client:
        with pytest.raises(error_type) as raised:
            await client.me()
    error = raised.value
    assert type(error) is error_type
    assert (error.status, error.kind, error.detail) == (status, "some-problem", "what went wrong")
    assert error.type == "https://corral.dev/problems/some-problem"
    assert error.title == "some problem"
    assert str(error) == "what went wrong"


async def test_a_validation_problem_names_each_field() -> None:
    """A 422's `errors` become FieldError values on the exception."""
    errors = [{"field": "resources.cpu", "message": "must be positive"}]
    answer = problem(422, "validation-error", "resources.cpu: must be positive", errors=errors)
    async with _answering(answer) as client:
        with pytest.raises(ValidationError) as raised:
            await client.get_session(uuid.uuid4())
    assert [(e.field, e.message) for e in raised.value.errors] == [
        ("resources.cpu", "must be positive")
    ]


async def test_an_error_that_is_not_problem_details_quotes_the_body() -> None:
    """A proxy's HTML error page still raises by status, with its start in the message."""
    async with _answering(httpx.Response(502, text="<h1>Bad gateway</h1>")) as client:
        with pytest.raises(ServerError) as raised:
            await client.me()
    assert raised.value.status == 502
    assert "502 Bad Gateway: <h1>Bad gateway</h1>" in str(raised.value)
    assert "GET http://manager.test/v1/me" in str(raised.value)


async def test_a_success_without_json_is_an_error_naming_the_server() -> None:
    """A 200 that is not JSON (not a corral manager) raises instead of a decoding traceback."""
    async with _answering(httpx.Response(200, text="hello")) as client:
        with pytest.raises(CorralError, match=re.escape("is http://manager.test a corral manager")):
            await client.me()


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (httpx.ConnectError("connection refused"), "cannot reach corral at http://manager.test"),
        (httpx.ReadTimeout("slow"), "did not answer within 30 s"),
    ],
)
async def test_an_unreachable_server_raises_unreachable_error(
    error: Exception, message: str
) -> None:
    """Connection failures and timeouts raise UnreachableError, which has no status."""
    async with _raising(error) as client:
        with pytest.raises(UnreachableError, match=message) as raised:
            await client.me()
    assert raised.value.status is None


def test_a_url_without_http_scheme_is_refused() -> None:
    """A URL that is not http(s) is a configuration error, not a confusing request failure."""
    with pytest.raises(ClientConfigError, match="must start with http"):
        Client("manager:8470", TOKEN)


async def test_requests_carry_the_bearer_token() -> None:
    """Every request authenticates with the token given to the client."""
    api = FakeApi()
    async with api.client() as client:
        me = await client.me()
    assert me.name == "alice"
    assert api.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"


async def test_create_session_sends_the_spec_and_returns_a_typed_session() -> None:
    """The spec is posted as JSON (only the fields given) and the answer parsed."""
    api = FakeApi()
    spec = SessionSpec(image="python", command=["python", "-c", "print(1)"], name="one")
    async with api.client() as client:
        session = await client.create_session(spec)
    assert api.created == [
        {"image": "python", "command": ["python", "-c", "print(1)"], "name": "one"}
    ]
    assert session.status is SessionStatus.PENDING
    assert session.name == "one"
    assert session.resources["mem"] == Decimal(1024**3)
    assert session.kernels is not None
    assert session.kernels[0].status is KernelStatus.PENDING


async def test_create_session_from_fields_validates_them_before_sending() -> None:
    """Invalid fields raise ValidationError naming the field, and nothing is sent."""
    api = FakeApi()
    async with api.client() as client:
        with pytest.raises(ValidationError) as raised:
            await client.create_session(image="python", command=[], type="BATCH")
    assert raised.value.status is None
    assert [e.field for e in raised.value.errors] == ["command"]
    assert api.requests == []


async def test_create_session_refuses_a_spec_and_fields_together() -> None:
    """Giving both a spec and fields is a programming error, not a silent merge."""
    async with FakeApi().client() as client:
        with pytest.raises(TypeError):
            await client.create_session(SessionSpec(image="python", command=["x"]), name="n")


async def test_iter_sessions_follows_the_cursors_to_the_last_page() -> None:
    """Five sessions at two per page: three requests, every session once, newest first."""
    api = FakeApi(page_size=2)
    ids = [api.add_session() for _ in range(5)]
    async with api.client() as client:
        listed = [str(s.id) async for s in client.iter_sessions()]
    assert listed == ids[::-1]
    cursors = [r.url.params.get("cursor") for r in api.sent("GET", "/v1/sessions")]
    assert cursors == [None, "2", "4"]


async def test_list_sessions_sends_filters_and_repeats_statuses() -> None:
    """Filters given are sent (several statuses as a repeated parameter); None ones are not."""
    api = FakeApi()
    async with api.client() as client:
        await client.list_sessions(status=["RUNNING", "PENDING"], owner="bob", limit=5)
    params = api.requests[0].url.params
    assert params.get_list("status") == ["RUNNING", "PENDING"]
    assert (params["owner"], params["limit"]) == ("bob", "5")
    assert "cursor" not in params and "type" not in params


async def test_session_logs_reads_from_an_offset() -> None:
    """`session_logs` returns the stored bytes from the offset, untouched."""
    api = FakeApi()
    session_id = api.add_session()
    api.logs[(session_id, "stderr")] = b"\x00binary\nlog"
    async with api.client() as client:
        data = await client.session_logs(session_id, stream="stderr", offset=1)
    assert data == b"binary\nlog"


async def test_follow_logs_yields_output_until_the_session_ends() -> None:
    """The followed log ends once the session has ended and everything was sent."""
    api = FakeApi()
    session_id = api.add_session()
    api.logs[(session_id, "stdout")] = b"42\n"

    async def run(session: str) -> None:
        await api.finish(session, exit_code=0)

    api.on_follow = run
    async with api.client() as client:
        chunks = [chunk async for chunk in client.follow_logs(session_id)]
    assert b"".join(chunks) == b"42\n"
    assert api.requests[0].url.params["follow"] == "true"


async def test_follow_logs_of_a_missing_session_raises_not_found() -> None:
    """An error answer to a followed stream raises before any chunk."""
    async with FakeApi().client() as client:
        with pytest.raises(NotFoundError, match="no session"):
            async for _ in client.follow_logs(uuid.uuid4()):
                pass


async def test_follow_events_parses_the_event_stream() -> None:
    """Server-Sent Events become typed events, replayed after `since`."""
    api = FakeApi()
    session_id = api.add_session()
    await api.move(session_id, "SCHEDULED", "placed")
    await api.move(session_id, "PREPARING")
    async with api.client() as client:
        events = client.follow_events(since=1)
        async with aclosing(events):
            event = await anext(events)
    assert event.id == 2
    assert event.kind == "session.status_changed"
    assert event.entity_id == session_id
    assert event.payload == {"from": "SCHEDULED", "to": "PREPARING", "reason": ""}
    assert api.requests[0].headers["Accept"] == "text/event-stream"


async def test_events_lists_a_page_after_an_id() -> None:
    """`events` asks for a JSON page (follow=false) of the events after `since`."""
    api = FakeApi()
    session_id = api.add_session()
    await api.move(session_id, "SCHEDULED")
    await api.move(session_id, "PREPARING")
    async with api.client() as client:
        page = await client.events(since=1)
    assert [e.id for e in page.items] == [2]
    assert api.requests[0].url.params["follow"] == "false"


async def test_agents_keep_their_exact_slots() -> None:
    """Agents' capacity and occupancy come from the exact milli-unit amounts."""
    api = FakeApi()
    api.agents = [agent_json("node-1")]
    async with api.client() as client:
        page = await client.list_agents()
    agent = page.items[0]
    assert agent.capacity["mem"] == Decimal(16 * 1024**3)
    assert agent.occupied.format_human() == "cpu=1"


async def test_resolve_session_id_accepts_a_full_id_without_a_request() -> None:
    """A full id is used as is."""
    api = FakeApi()
    session_id = uuid.uuid4()
    async with api.client() as client:
        assert await client.resolve_session_id(str(session_id)) == session_id
    assert api.requests == []


async def test_resolve_session_id_asks_the_server_for_a_number_prefix_or_name() -> None:
    """A number, a unique id prefix or an exact name is resolved by the API to the id."""
    api = FakeApi()
    first = api.add_session(id="aaaa1111-0000-4000-8000-000000000000", name="train")
    api.add_session(id="bbbb2222-0000-4000-8000-000000000000")
    async with api.client() as client:
        assert str(await client.resolve_session_id("1")) == first
        assert str(await client.resolve_session_id("aaaa")) == first
        assert str(await client.resolve_session_id("train")) == first
    assert [r.url.path for r in api.requests] == [
        "/v1/sessions/1",
        "/v1/sessions/aaaa",
        "/v1/sessions/train",
    ]


async def test_resolve_session_id_refuses_ambiguous_and_unknown_references() -> None:
    """A prefix of two sessions is a conflict naming both numbers; one of none is not found."""
    api = FakeApi()
    api.add_session(id="abcd1111-0000-4000-8000-000000000000")
    api.add_session(id="abcd2222-0000-4000-8000-000000000000")
    async with api.client() as client:
        with pytest.raises(ConflictError, match=r"\(1, 2\); give the session's number"):
            await client.resolve_session_id("abcd")
        with pytest.raises(NotFoundError):
            await client.resolve_session_id("ffff")


async def test_terminate_history_explain_and_delete() -> None:
    """The remaining session routes parse their answers, and a 409 raises ConflictError."""
    api = FakeApi()
    session_id = api.add_session()
    api.history[session_id] = [
        {
            "phase": "schedule",
            "from_status": "PENDING",
            "to_status": None,
            "result": "NEED_RETRY",
            "error_code": "insufficient_resources",
            "message": "no agent fits",
            "attempts": 3,
            "created_at": "2030-01-01T09:00:00+00:00",
            "updated_at": "2030-01-01T09:01:00+00:00",
        }
    ]
    async with api.client() as client:
        explanation = await client.explain(session_id)
        history = await client.session_history(session_id)
        with pytest.raises(ConflictError, match="has not ended"):
            await client.delete_session(session_id)
        result = await client.terminate_session(session_id)
        await api.finish(session_id)
        await client.delete_session(session_id)
    assert (explanation.position, explanation.code) == (1, "no_capacity")
    assert history[0].attempts == 3
    assert (result.outcome, result.status) == ("terminating", SessionStatus.TERMINATING)
    assert session_id not in api.sessions


async def test_session_ids_are_escaped_in_paths() -> None:
    """A reference with a slash cannot reach another route."""
    api = FakeApi()
    async with api.client() as client:
        with pytest.raises(NotFoundError):
            await client.get_session("x/terminate")
    assert api.requests[0].url.raw_path == b"/v1/sessions/x%2Fterminate"
