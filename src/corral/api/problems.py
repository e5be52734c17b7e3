"""Errors as RFC 9457 problem details: a stable `type`, a title, and a detail naming the field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.controller.sessions import SubmissionError, SubmissionForbiddenError
from corral.domain.field_errors import FieldError, describe, field_errors
from corral.domain.refs import REF_AMBIGUOUS
from corral.store.session_refs import AmbiguousSessionRefError

PROBLEM_BASE = "https://corral.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"
REQUEST_TOO_LARGE = "request-too-large"  # 413: a body past the manager's cap
# Problem types of Starlette's own HTTP errors, by status.
_HTTP_SLUGS = {404: "not-found", 405: "method-not-allowed", 413: REQUEST_TOO_LARGE}


class ProblemDetails(BaseModel):
    """The body of every error answer; some kinds add members (e.g. `errors`, per field)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


# Every route's client errors, for the OpenAPI document (it replaces FastAPI's default 422,
# whose body is not ours).
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {
        "description": "A problem-details document (RFC 9457) whose `type` names the error",
        "content": {PROBLEM_MEDIA_TYPE: {"schema": ProblemDetails.model_json_schema()}},
    }
}


class Problem(Exception):
    """An error the API answers with: `kind` is the stable slug of its `type` URI."""

    def __init__(self, status: int, kind: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.extra = extra

    def body(self, instance: str | None = None) -> dict[str, Any]:
        """The problem-details document."""
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.kind,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance is not None:
            body["instance"] = instance
        body.update(self.extra)
        return body


def problem_response(problem: Problem, request: Request | None = None) -> JSONResponse:
    """The HTTP response carrying `problem`."""
    instance = request.url.path if request is not None else None
    headers = {"WWW-Authenticate": "Bearer"} if problem.status == 401 else None
    return JSONResponse(
        problem.body(instance),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Make every error the app raises a problem-details response."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc, request)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(invalid_request(field_errors(exc.errors())), request)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        slug = _HTTP_SLUGS.get(exc.status_code, "http-error")
        problem = Problem(exc.status_code, slug, str(exc.detail), str(exc.detail))
        return problem_response(problem, request)

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


def ambiguous_ref(exc: AmbiguousSessionRefError, what: str) -> Problem:
    """409 `session-ambiguous`: a reference to a `what` ("session", "array") that fits several,
    with the candidates to choose from."""
    return Problem(
        409,
        REF_AMBIGUOUS,
        f"The {what} reference is ambiguous",
        str(exc),
        candidates=[
            {"number": c.number, "ref": c.ref, "id": str(c.id), "owner": c.owner}
            for c in exc.candidates
        ],
    )


def creation_id_conflict(detail: str, fields: Sequence[str], session_id: str) -> Problem:
    """409 `creation-id-conflict`: the key was used for another request; `fields` differ."""
    return Problem(
        409,
        "creation-id-conflict",
        "The creation_id was used for a different request",
        detail,
        fields=list(fields),
        session_id=session_id,
    )


def invalid_request(errors: Sequence[FieldError]) -> Problem:
    """422 `validation-error`: each invalid field in `errors`, all of them in `detail`."""
    return Problem(
        422,
        "validation-error",
        "The request is not valid",
        describe(errors) or "invalid request",
        errors=[{"field": e.field, "message": e.message} for e in errors],
    )


def forbidden_field(field: str, message: str) -> Problem:
    """403 `forbidden-field`: a valid request the caller may not make; `errors` names the field
    that needs more rights than theirs (e.g. a resource group not open to them)."""
    return Problem(
        403,
        "forbidden-field",
        "Not allowed",
        describe([FieldError(field, message)]),
        errors=[{"field": field, "message": message}],
    )


def refused_submission(exc: SubmissionError) -> Problem:
    """The problem a refused submission answers: 403 when it needs an admin, else 422."""
    if isinstance(exc, SubmissionForbiddenError):
        return forbidden_field(exc.field, exc.message)
    return invalid_request([FieldError(exc.field, exc.message)])
