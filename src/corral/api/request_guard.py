"""What every request must be before a route sees it: a body within the cap, no NUL in its
path or query.

A body past `max_request_bytes` is answered 413 (from its Content-Length before anything is
read, else as soon as the bytes read pass the cap), so no route holds a huge body in memory or
writes part of it. Routes with a cap of their own (an upload's archive, an agent's outputs)
are left to it. A NUL in the path or a query parameter would reach the database, which
PostgreSQL refuses in text (a 500 before): a 422 naming the parameter. (Percent-decoding
replaces bytes that are not UTF-8, so no lone surrogate can arrive this way.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.problems import REQUEST_TOO_LARGE, Problem, invalid_request, problem_response
from corral.domain.bounds import text_problem
from corral.domain.field_errors import FieldError


class RequestTooLargeError(HTTPException):
    """The body read so far is past the cap: FastAPI passes an HTTPException on as it is."""

    def __init__(self, cap: int) -> None:
        super().__init__(413, too_large_detail(cap))


def too_large_detail(cap: int, size: int | None = None) -> str:
    """What a 413 says: the cap (the `max_request_bytes` setting), and the size if known."""
    got = f" ({size} bytes)" if size is not None else ""
    return (
        f"the request body{got} is larger than the manager takes: at most {cap} bytes "
        f"({cap / 2**20:.1f} MiB, setting max_request_bytes)"
    )


class RequestGuard:
    """ASGI middleware: the body cap and the NUL check of the module's docstring."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, uncapped: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        # (method, path regex) of the routes that cap their own bodies.
        self._uncapped = [(method, re.compile(path)) for method, path in uncapped]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = _nul_in_request(scope)
        if refused is not None:
            await problem_response(refused)(scope, receive, send)
            return
        if any(
            scope["method"] == method and path.match(scope["path"])
            for method, path in self._uncapped
        ):
            await self.app(scope, receive, send)
            return
        cap = self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            problem = Problem(
                413, REQUEST_TOO_LARGE, "Request too large", too_large_detail(cap, declared)
            )
            await problem_response(problem)(scope, receive, send)
            return
        received = 0

        async def capped() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise RequestTooLargeError(cap)
            return message

        await self.app(scope, capped, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _nul_in_request(scope: Scope) -> Problem | None:
    """422 naming the path or the first query parameter that holds a NUL, or None."""
    errors: list[FieldError] = []
    problem = text_problem(scope["path"])
    if problem is not None:
        errors.append(FieldError("path", problem))
    query = scope.get("query_string", b"").decode("latin-1")
    if "%00" in query or "\0" in query:
        for name, value in parse_qsl(query, keep_blank_values=True):
            problem = text_problem(name) or text_problem(value)
            if problem is not None:
                errors.append(FieldError(name.replace("\0", "\\0"), problem))
                break
    return invalid_request(errors) if errors else None
