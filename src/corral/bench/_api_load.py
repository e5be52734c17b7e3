"""The load generator of `corral bench api`: warm-up, create phase, read phase, over HTTP.

It runs in its own process (`python -m corral.bench._api_load`, driven by `corral.bench.api`)
so that its own work does not slow the manager's event loop, and speaks HTTP through the lean
`KeepAliveClient` (httpx itself would be the bottleneck, see `corral.bench._http`); `measure`
also runs in-process over any `Http`, which is how the tests use it.
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

from corral.bench._http import Http, HttpError, KeepAliveClient, Reply
from corral.domain.record import record

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


@record
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
    http: Http,
    load: ApiLoad,
    progress: Progress | None = None,
    between: Callable[[int], Awaitable[None]] | None = None,
) -> ApiFigures:
    """Warm up, then create `load.sessions` sessions and read them at `load.get_rate_per_s`.

    `http` knows the server and the token; `between` is awaited between the phases with
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


async def _warm_up(http: Http) -> str:
    """Create one session and read it back; its id. Raises ApiBenchError on any refusal."""
    created = await _request(http, "POST", SESSIONS_PATH, SESSION_BODY)
    if created.status not in (200, 201):
        hint = ""
        if created.status == 404:
            hint = " (this manager has no sessions API at that path: is it older than the bench?)"
        raise ApiBenchError(
            f"POST {SESSIONS_PATH} answered {_describe(created)}{hint}; nothing to measure",
            status=created.status,
        )
    session_id = _session_id(created)
    read = await _request(http, "GET", f"{SESSIONS_PATH}/{session_id}")
    if read.status != 200:
        raise ApiBenchError(
            f"GET {SESSIONS_PATH}/{session_id} of a session just created answered "
            f"{_describe(read)}; nothing to measure",
            status=read.status,
        )
    return session_id


async def _request(http: Http, method: str, path: str, body: Any = None) -> Reply:
    """One warm-up request; a transport failure is an ApiBenchError naming the request."""
    try:
        return await http.request(method, path, body)
    except HttpError as exc:
        raise ApiBenchError(f"{method} {path} failed: {exc}") from exc


def _session_id(reply: Reply) -> str:
    try:
        session_id = reply.json()["id"]
    except (ValueError, KeyError, TypeError):
        raise ApiBenchError(
            f"POST {SESSIONS_PATH} answered {reply.status} without a session id: "
            f"{reply.text[:200]!r}"
        ) from None
    return str(session_id)


def _describe(reply: Reply) -> str:
    """`404 Not Found: <problem detail or the start of the body>`."""
    detail = reply.text[:200]
    if reply.content_type.startswith("application/problem+json"):
        # Not a JSON object after all: the raw text says more.
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(reply.json().get("detail", detail))
    return f"{reply.status} {reply.reason}: {detail}".rstrip(": ")


async def _create(
    http: Http,
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
                reply = await http.request("POST", SESSIONS_PATH, SESSION_BODY)
            except HttpError as exc:
                figures.note_error(f"POST {_kind(exc)}", f"POST {SESSIONS_PATH}: {exc}")
                continue
            if reply.status not in (200, 201):
                figures.note_error(
                    f"POST {reply.status}", f"POST {SESSIONS_PATH}: {_describe(reply)}"
                )
                continue
            figures.create_ms.append((time.perf_counter() - started) * 1000)
            ids.append(_session_id(reply))
            if progress is not None and len(figures.create_ms) % step == 0:
                progress(f"created {len(figures.create_ms)}/{load.sessions}")

    first = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(load.concurrency, load.sessions))))
    figures.create_s = time.perf_counter() - first


async def _read(http: Http, load: ApiLoad, figures: ApiFigures, ids: Sequence[str]) -> None:
    """The read phase: `load.get_requests` GETs, one every 1/rate seconds, in their own tasks."""

    async def get(session_id: str) -> None:
        path = f"{SESSIONS_PATH}/{session_id}"
        started = time.perf_counter()
        try:
            reply = await http.request("GET", path)
        except HttpError as exc:
            figures.note_error(f"GET {_kind(exc)}", f"GET {path}: {exc}")
            return
        if reply.status != 200:
            figures.note_error(f"GET {reply.status}", f"GET {path}: {_describe(reply)}")
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


def _kind(error: HttpError) -> str:
    """`ReadTimeout` of `ReadTimeout: no answer within 30 s`: what errors are counted by."""
    return str(error).partition(":")[0]


async def _drive(plan: dict[str, Any]) -> ApiFigures:
    """The load generator's work: `measure` over a client on the plan's URL and token."""
    load = ApiLoad(**plan["load"])

    async def between(created: int) -> None:
        print(json.dumps({"created": created}), flush=True)
        go = await asyncio.to_thread(sys.stdin.readline)  # the manager settles meanwhile
        if not go:
            raise ApiBenchError("the bench stopped before the read phase")

    http = KeepAliveClient(plan["url"], token=plan["token"], timeout_s=REQUEST_TIMEOUT_S)
    try:
        return await measure(
            http, load, progress=lambda line: print(line, file=sys.stderr), between=between
        )
    finally:
        await http.close()


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
