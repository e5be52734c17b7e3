"""`corral bench api`: its arguments, its output, and how it reports an API that refuses it."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

import httpx
import pytest
import typer
from fastapi import FastAPI
from typer.testing import CliRunner

from corral.api.problems import Problem, install_problem_handlers
from corral.bench._api_load import WARMUP_REQUESTS
from corral.bench._http import HttpxClient
from corral.bench.api import ApiBenchError, ApiBenchResult, ApiFigures, ApiLoad, measure
from corral.cli import bench_api as cli_module
from corral.cli.bench_api import api_command

runner = CliRunner()


def cli() -> typer.Typer:
    """`bench` with the `api` command, as `corral bench` registers it."""
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("api")(api_command)
    return app


class FakeBench:
    """Stands in for run_api_bench: records its arguments, returns fixed figures."""

    def __init__(self, figures: ApiFigures | None = None, error: Exception | None = None) -> None:
        self.figures = figures or ApiFigures(
            create_s=2.0, create_ms=[1.0] * 10, get_s=1.0, get_ms=[2.0, 3.0, 4.0]
        )
        self.error = error
        self.calls: list[tuple[str, ApiLoad, int | None]] = []

    async def __call__(
        self, database: str, load: ApiLoad, *, agents: int | None, progress: Any
    ) -> ApiBenchResult:
        self.calls.append((database, load, agents))
        if self.error is not None:
            raise self.error
        return ApiBenchResult("sqlite", agents or 0, load, self.figures, settle_s=2.5)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBench:
    """run_api_bench replaced by a FakeBench (no manager, no process, no network)."""
    bench = FakeBench()
    monkeypatch.setattr(cli_module, "run_api_bench", bench)
    return bench


@pytest.mark.parametrize(
    ("flag", "bad"),
    [
        ("--sessions", "0"),
        ("--concurrency", "0"),
        ("--concurrency", "1025"),
        ("--get-rate", "0"),
        ("--get-duration", "0"),
        ("--agents", "-1"),
        ("--sessions", "many"),
    ],
)
def test_out_of_range_arguments_exit_2_naming_the_option(
    fake: FakeBench, flag: str, bad: str
) -> None:
    """Each bad value is a usage error (exit 2) that names the option; nothing runs."""
    result = runner.invoke(cli(), ["api", flag, bad])
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert fake.calls == []


def test_arguments_reach_the_bench_and_json_is_one_object(fake: FakeBench) -> None:
    """The flags become the load, agents and database; --json prints only the figures."""
    args = ["api", "--sessions", "10", "--concurrency", "4", "--get-rate", "50"]
    args += ["--get-duration", "0.5", "--agents", "0", "--database", "sqlite", "--json"]
    result = runner.invoke(cli(), args)
    assert result.exit_code == 0, result.output
    assert fake.calls == [("sqlite", ApiLoad(10, 4, 50.0, 0.5), 0)]
    output = json.loads(result.stdout)
    assert output["benchmark"] == "api"
    assert (output["created"], output["create_per_s"], output["settle_s"]) == (10, 5.0, 2.5)
    assert (output["get_p50_ms"], output["get_p99_ms"], output["errors"]) == (3.0, 4.0, 0)


def test_defaults_are_the_issue_s_benchmark(fake: FakeBench) -> None:
    """With no flags: SQLite, 2,000 sessions, 32 in flight, GETs at 200/s for 5 s."""
    result = runner.invoke(cli(), ["api", "--json"])
    assert result.exit_code == 0, result.output
    assert fake.calls == [("sqlite", ApiLoad(2000, 32, 200.0, 5.0), None)]


def test_failed_requests_exit_1_after_printing_the_figures(fake: FakeBench) -> None:
    """Errors are counted in the JSON, and the exit code says the run was not clean."""
    fake.figures.errors = {"POST 503": 2}
    fake.figures.error_samples = ["POST /v1/sessions: 503 Service Unavailable: busy"]
    result = runner.invoke(cli(), ["api", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["errors"] == 2
    assert "2 requests failed" in result.stderr
    assert "503 Service Unavailable: busy" in result.stderr


def test_a_refused_bench_is_one_error_line(fake: FakeBench) -> None:
    """An ApiBenchError is `corral: error: <what the API said>`, exit 1, no JSON."""
    fake.error = ApiBenchError("POST /v1/sessions answered 404 Not Found", status=404)
    result = runner.invoke(cli(), ["api", "--json"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "corral: error: POST /v1/sessions answered 404 Not Found" in result.stderr


@pytest.mark.parametrize(
    "fields",
    [
        {"sessions": 0},
        {"concurrency": 0},
        {"get_rate_per_s": 0.0},
        {"get_rate_per_s": float("inf")},
        {"get_duration_s": -1.0},
    ],
)
def test_api_load_refuses_nonsense(fields: dict[str, Any]) -> None:
    """ApiLoad names the bad field, for callers that skip the command line."""
    (name,) = fields
    with pytest.raises(ValueError, match=name):
        ApiLoad(**fields)


def client(app: FastAPI) -> httpx.AsyncClient:
    """An HTTP client on `app`, in-process."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://manager")


async def test_an_api_without_the_sessions_route_is_reported_as_a_404() -> None:
    """The warm-up's 404 stops the bench with the status and what the API said."""
    app = FastAPI()
    install_problem_handlers(app)
    async with client(app) as http:
        with pytest.raises(ApiBenchError) as raised:
            await measure(HttpxClient(http), ApiLoad(sessions=1))
    assert raised.value.status == 404
    message = str(raised.value)
    assert message.startswith("POST /v1/sessions answered 404 Not Found: Not Found")
    assert "no sessions API" in message


async def test_a_refused_warm_up_quotes_the_problem_detail() -> None:
    """A problem-details refusal (here 422) is quoted by its detail."""
    app = FastAPI()
    install_problem_handlers(app)

    @app.post("/v1/sessions")
    async def refuse() -> None:
        raise Problem(422, "validation-error", "Invalid", "resources.cpu: not a number")

    async with client(app) as http:
        with pytest.raises(ApiBenchError, match=r"422 Unprocessable Entity: resources\.cpu"):
            await measure(HttpxClient(http), ApiLoad(sessions=1))


async def test_failures_after_the_warm_up_are_counted_and_sampled() -> None:
    """Every other create fails with a 503 problem: counted by kind, the first one quoted."""
    app = FastAPI()
    install_problem_handlers(app)
    answers = itertools.count()

    @app.post("/v1/sessions", status_code=201)
    async def create() -> dict[str, str]:
        n = next(answers)
        if n >= WARMUP_REQUESTS and (n - WARMUP_REQUESTS) % 2 == 0:
            raise Problem(503, "busy", "Busy", f"request {n} refused")
        return {"id": str(uuid.uuid4())}

    @app.get("/v1/sessions/{session_id}")
    async def read(session_id: str) -> dict[str, str]:
        return {"id": session_id}

    load = ApiLoad(sessions=10, concurrency=1, get_rate_per_s=1000.0, get_duration_s=0.005)
    async with client(app) as http:
        figures = await measure(HttpxClient(http), load)
    assert len(figures.create_ms) == 5
    assert figures.errors == {"POST 503": 5}
    assert figures.error_samples == [
        f"POST /v1/sessions: 503 Service Unavailable: request {WARMUP_REQUESTS} refused"
    ]
    assert len(figures.get_ms) == load.get_requests == 5
