"""The SDK's exceptions: API problem details (RFC 9457) and an unreachable server, as types."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral.domain.field_errors import FieldError as FieldError  # re-exported: the SDK names it

if TYPE_CHECKING:  # not at run time: the command line's plain calls never load httpx
    import httpx

ABOUT_BLANK = "about:blank"
# How much of a body that is not problem details an error message quotes.
_QUOTED_BODY_CHARS = 200

# The problem type of a refused spec (the API's, and the SDK's own check before a request).
VALIDATION_PROBLEM = "https://corral.dev/problems/validation-error"


class CorralError(Exception):
    """An error from corral's API, carrying its problem details; `str()` is the detail.

    `status` is the HTTP status, None when the error arose before an answer (a request the
    client refused to send, or a server it could not reach).
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        type: str = ABOUT_BLANK,
        title: str = "",
        errors: Sequence[FieldError] = (),
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.type = type
        self.title = title
        self.errors = tuple(errors)

    @property
    def kind(self) -> str:
        """The stable slug of `type`, e.g. `session-not-found` (the whole URI if it has none)."""
        return self.type.rstrip("/").rpartition("/")[2] or self.type


class NotFoundError(CorralError):
    """404: no such thing, or one the caller may not see."""


class AuthError(CorralError):
    """401 (no, unknown or expired token) or 403 (not allowed, e.g. admins only)."""


class ConflictError(CorralError):
    """409: the request contradicts the current state (e.g. removing a running session)."""


class ValidationError(CorralError):
    """422 (or refused before sending): the request is not valid; `errors` names each field."""


class ServerError(CorralError):
    """5xx: the server failed; retrying later may help."""


class UnreachableError(CorralError):
    """The server could not be reached, or did not answer in time, or the connection broke."""


def error_from_response(response: httpx.Response) -> CorralError:
    """The exception for an error response (its body must have been read)."""
    where = f"{response.request.method} {response.request.url}"
    return error_from_answer(response.status_code, response.reason_phrase, response.content, where)


def error_from_answer(status: int, reason: str, content: bytes, where: str) -> CorralError:
    """The exception for an error answer: its status, reason phrase and body, to the request
    `where` names ("GET https://...")."""
    cls = _class_for(status)
    reason = reason or f"HTTP {status}"
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("detail", body.get("title")), str):
        # Not problem details: a proxy's page, or a server that is not corral's.
        text = content.decode(errors="replace").strip()[:_QUOTED_BODY_CHARS]
        detail = f"{where} answered {status} {reason}" + (f": {text}" if text else "")
        return cls(detail, status=status, title=reason)
    title = str(body.get("title") or reason)
    errors = [
        FieldError(str(item.get("field", "")), str(item.get("message", "")))
        for item in body.get("errors") or ()
        if isinstance(item, dict)
    ]
    return cls(
        str(body.get("detail") or title),
        status=status,
        type=str(body.get("type") or ABOUT_BLANK),
        title=title,
        errors=errors,
    )


def _class_for(status: int) -> type[CorralError]:
    if status == 404:
        return NotFoundError
    if status in (401, 403):
        return AuthError
    if status == 409:
        return ConflictError
    if status in (400, 422):
        return ValidationError
    if status >= 500:
        return ServerError
    return CorralError
