"""The load generator of `corral bench api`: warm-up, create phase, read phase, over HTTP.

It runs in its own process (`python -m corral.bench._api_load`, driven by `corral.bench.api`)
so that its own work does not slow the manager's event loop; `measure` also runs in-process
against any httpx client, which is how the tests use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

SESSIONS_PATH = "/v1/sessions"
SESSION_BODY: dict[str, Any] = {"image": "python", "command": ["true"], "resources": {"cpu": 1}}
WARMUP_REQUESTS = 5
REQUEST_TIMEOUT_S = 30.0  # a request slower than this counts as an error, not a latency
MAX_ERROR_SAMPLES = 5

Progress = Callable[[str], None]


class ApiBenchError(RuntimeError):
    """The bench could not measure: the API refused the warm-up, or the load generator failed.

    `status` is the HTTP status of the refused request, when there was one.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ApiLoad:
    """What the load generator sends."""

    sessions: int = 2000
    concurrency: int = 32
    get_rate_per_s: float = 200.0
    get_duration_s: float = 5.0

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be at least 1, got {self.sessions}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if not (self.get_rate_per_s > 0 and math.isfinite(self.get_rate_per_s)):
            raise ValueError(f"get_rate_per_s must be > 0, got {self.get_rate_per_s}")
        if not (self.get_duration_s > 0 and math.isfinite(self.get_duration_s)):
            raise ValueError(f"get_duration_s must be > 0 seconds, got {self.get_duration_s}")

    @property
    def get_requests(self) -> int:
        """How many GETs the read phase sends (at least one)."""
        return max(1, round(self.get_rate_per_s * self.get_duration_s))


@dataclass(slots=True)
class ApiFigures:
    """What the load generator measured (times in ms, spans in s)."""

    create_s: float = 0.0  # first POST sent to last POST answered
    create_ms: list[float] = field(default_factory=list)  # of the successful ones
    get_s: float = 0.0  # first GET sent to last GET sent
    get_ms: list[float] = field(default_factory=list)  # of the successful ones
    errors: dict[str, int] = field(default_factory=dict)  # "POST 503", "GET ReadTimeout" → count
    error_samples: list[str] = field(default_factory=list)  # the first of each kind

    def note_error(self, kind: str, sample: str) -> None:
        """Count one failed request of `kind`; keep `sample` if it is that kind's first."""
        if kind not in self.errors and len(self.error_samples) < MAX_ERROR_SAMPLES:
            self.error_samples.append(sample)
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def measure(
    http: httpx.AsyncClient,
    load: ApiLoad,
    progress: Progress | None = None,
    between: Callable[[int], Awaitable[None]] | None = None,
) -> ApiFigures:
    """Warm up, then create `load.sessions` sessions and read them at `load.get_rate_per_s`.

    `http` carries the base URL and the token; `between` is awaited between the phases with
    the number created. The warm-up must succeed, else ApiBenchError says what the API
    answered; later failures are counted and sampled in the figures.
    """
    ids = [await _warm_up(http) for _ in range(WARMUP_REQUESTS)]
    figures = ApiFigures()
    await _create(http, load, figures, ids, progress)
    if between is not None:
        await between(len(figures.create_ms))
    if progress is not None:
        progress(
            f"created {len(figures.create_ms)}/{load.sessions} in {figures.create_s:.2f} s; "
            f"reading them at {load.get_rate_per_s:g}/s for {load.get_duration_s:g} s"
        )
    await _read(http, load, figures, ids[WARMUP_REQUESTS:] or ids)
    return figures


async def _warm_up(http: httpx.AsyncClient) -> str:
    """Create one session and read it back; its id. Raises ApiBenchError on any refusal."""
    created = await _request(http, "POST", SESSIONS_PATH, json=SESSION_BODY)
    if created.status_code not in (200, 201):
        hint = ""
        if created.status_code == 404:
            hint = " (this manager has no sessions API at that path: is it older than the bench?)"
        raise ApiBenchError(
            f"POST {SESSIONS_PATH} answered {_describe(created)}{hint}; nothing to measure",
            status=created.status_code,
        )
    session_id = _session_id(created)
    read = await _request(http, "GET", f"{SESSIONS_PATH}/{session_id}")
    if read.status_code != 200:
        raise ApiBenchError(
            f"GET {SESSIONS_PATH}/{session_id} of a session just created answered "
            f"{_describe(read)}; nothing to measure",
            status=read.status_code,
        )
    return session_id


async def _request(
    http: httpx.AsyncClient, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    """One warm-up request; a transport failure is an ApiBenchError naming the server."""
    try:
        return await http.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise ApiBenchError(
            f"{method} {http.base_url}{path.lstrip('/')} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _session_id(response: httpx.Response) -> str:
    try:
        session_id = response.json()["id"]
    except (ValueError, KeyError, TypeError):
        raise ApiBenchError(
            f"POST {SESSIONS_PATH} answered {response.status_code} without a session id: "
            f"{response.text[:200]!r}"
        ) from None
    return str(session_id)


def _describe(response: httpx.Response) -> str:
    """`404 Not Found: <problem detail or the start of the body>`."""
    detail = response.text[:200]
    if response.headers.get("content-type", "").startswith("application/problem+json"):
        with contextlib.suppress(ValueError):  # not JSON after all: the raw text says more
            detail = str(response.json().get("detail", detail))
    return f"{response.status_code} {response.reason_phrase}: {detail}".rstrip(": ")


async def _create(
    http: httpx.AsyncClient,
    load: ApiLoad,
    figures: ApiFigures,
    ids: list[str],
    progress: Progress | None,
) -> None:
    """The create phase: `load.concurrency` workers share `load.sessions` POSTs."""
    remaining = load.sessions
    step = max(1, load.sessions // 10)

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            try:
                response = await http.post(SESSIONS_PATH, json=SESSION_BODY)
            except httpx.HTTPError as exc:
                figures.note_error(f"POST {type(exc).__name__}", f"POST {SESSIONS_PATH}: {exc!r}")
                continue
            if response.status_code not in (200, 201):
                figures.note_error(
                    f"POST {response.status_code}", f"POST {SESSIONS_PATH}: {_describe(response)}"
                )
                continue
            figures.create_ms.append((time.perf_counter() - started) * 1000)
            ids.append(_session_id(response))
            if progress is not None and len(figures.create_ms) % step == 0:
                progress(f"created {len(figures.create_ms)}/{load.sessions}")

    first = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(load.concurrency, load.sessions))))
    figures.create_s = time.perf_counter() - first


async def _read(
    http: httpx.AsyncClient, load: ApiLoad, figures: ApiFigures, ids: Sequence[str]
) -> None:
    """The read phase: `load.get_requests` GETs, one every 1/rate seconds, in their own tasks."""

    async def get(session_id: str) -> None:
        path = f"{SESSIONS_PATH}/{session_id}"
        started = time.perf_counter()
        try:
            response = await http.get(path)
        except httpx.HTTPError as exc:
            figures.note_error(f"GET {type(exc).__name__}", f"GET {path}: {exc!r}")
            return
        if response.status_code != 200:
            figures.note_error(f"GET {response.status_code}", f"GET {path}: {_describe(response)}")
            return
        figures.get_ms.append((time.perf_counter() - started) * 1000)

    tasks: list[asyncio.Task[None]] = []
    first = time.perf_counter()
    for i in range(load.get_requests):
        delay_s = first + i / load.get_rate_per_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)  # the schedule itself, not a wait for a condition
        tasks.append(asyncio.create_task(get(ids[i % len(ids)]), name=f"bench-get-{i}"))
    figures.get_s = time.perf_counter() - first
    await asyncio.gather(*tasks)


async def _drive(plan: dict[str, Any]) -> ApiFigures:
    """The load generator's work: `measure` over a client on the plan's URL and token."""
    load = ApiLoad(**plan["load"])
    limits = httpx.Limits(max_connections=max(64, load.concurrency * 2))

    async def between(created: int) -> None:
        print(json.dumps({"created": created}), flush=True)
        go = await asyncio.to_thread(sys.stdin.readline)  # the manager settles meanwhile
        if not go:
            raise ApiBenchError("the bench stopped before the read phase")

    async with httpx.AsyncClient(
        base_url=plan["url"],
        headers={"Authorization": f"Bearer {plan['token']}"},
        timeout=REQUEST_TIMEOUT_S,
        limits=limits,
    ) as http:
        return await measure(
            http, load, progress=lambda line: print(line, file=sys.stderr), between=between
        )


def _main() -> None:
    """`python -m corral.bench._api_load`: JSON lines in and out (see `bench.api`)."""
    plan = json.loads(sys.stdin.readline())
    try:
        answer: dict[str, Any] = {"figures": asdict(asyncio.run(_drive(plan)))}
    except ApiBenchError as exc:
        answer = {"error": str(exc), "status": exc.status}
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    _main()
