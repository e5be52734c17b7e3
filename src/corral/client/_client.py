"""The async SDK client: one method per API operation, typed results, errors as exceptions."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Mapping,
    Sequence,
)
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from corral.client._cluster import ClusterCalls
from corral.client._deployments import DeploymentCalls
from corral.client._http import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S
from corral.client._http import array_path, http_options, session_path
from corral.client._paging import every_item
from corral.client._sse import parse_sse
from corral.client.config import (
    ClientConfig,
    load_client_config,
)
from corral.client.errors import (
    VALIDATION_PROBLEM,
    FieldError,
    NotFoundError,
    UnreachableError,
    ValidationError,
)
from corral.client.models import (
    ActivateResult,
    Agent,
    ArrayRemoveResult,
    ArrayTerminateResult,
    ArrayView,
    Attempts,
    Event,
    Explanation,
    HistoryEntry,
    OutputFile,
    Page,
    RetrySettings,
    Session,
    SessionArray,
    TerminateResult,
    Upload,
    User,
)
from corral.client.uploads import pack_directory
from corral.domain.arrays import ArraySpec
from corral.domain.field_errors import describe, field_errors
from corral.domain.spec import SessionSpec

T = TypeVar("T")
SpecT = TypeVar("SpecT", bound=SessionSpec)
SessionRef = uuid.UUID | str
LogStream = Literal["stdout", "stderr"]


class Client(ClusterCalls, DeploymentCalls):
    """An async client of corral's REST API; use it as `async with Client(url, token) as c:`.

    Every method raises a `CorralError` subclass for an error answer or an unreachable server.
    `transport` replaces the network (tests pass an `httpx.MockTransport` or an
    `httpx.ASGITransport` over the app). An https server's certificate is verified against
    `ca_file`, else the system's store.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        options = http_options(url, token, ca_file)
        self.url = options["base_url"]
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(**options, timeout=timeout_s, transport=transport)

    @classmethod
    def from_config(
        cls, config: ClientConfig | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> Client:
        """A client of the configured server (see `corral.client.config`)."""
        config = config or load_client_config()
        return cls(config.url, config.token, timeout_s=timeout_s, ca_file=config.ca_file)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (idempotent)."""
        await self._http.aclose()

    # --- sessions -------------------------------------------------------------------------

    async def create_session(self, spec: SessionSpec | None = None, **fields: Any) -> Session:
        """Submit a session: a `SessionSpec`, or its fields (e.g. `image=`, `command=`).

        Fields are validated here first, so a bad one raises `ValidationError` without a request.
        With a `creation_id` a repeated call returns the session the first one created.
        """
        if spec is None:
            spec = validate_spec(fields)
        elif fields:
            raise TypeError("give a SessionSpec or its fields, not both")
        body = spec.model_dump(mode="json", exclude_unset=True)
        return Session.model_validate(await self._json("POST", "/v1/sessions", json=body))

    async def create_array(self, spec: ArraySpec | None = None, **fields: Any) -> SessionArray:
        """Submit a job array (`array="0-99%5"` plus a session's fields): all elements or none.

        Validated here first like `create_session`; with a `creation_id` a repeated call
        returns the array the first one created.
        """
        if spec is None:
            spec = validated(ArraySpec, fields)
        elif fields:
            raise TypeError("give an ArraySpec or its fields, not both")
        body = spec.model_dump(mode="json", exclude_unset=True)
        return SessionArray.model_validate(await self._json("POST", "/v1/arrays", json=body))

    async def get_array(self, array: uuid.UUID | str) -> ArrayView:
        """A job array as a whole (by its number, name or id): its elements per state and each
        element."""
        return ArrayView.model_validate(await self._json("GET", array_path(array)))

    async def terminate_array(self, array: uuid.UUID | str) -> ArrayTerminateResult:
        """End every element of a job array: the pending ones cancelled, the others stopped."""
        path = f"{array_path(array)}/terminate"
        return ArrayTerminateResult.model_validate(await self._json("POST", path))

    async def delete_array(self, array: uuid.UUID | str) -> ArrayRemoveResult:
        """Remove every element of an ended job array (ConflictError while one has not ended)."""
        return ArrayRemoveResult.model_validate(await self._json("DELETE", array_path(array)))

    async def list_sessions(
        self,
        *,
        status: str | Sequence[str] | None = None,
        owner: str | None = None,
        resource_group: str | None = None,
        type: str | None = None,
        array_id: uuid.UUID | str | None = None,
        since: str | None = None,
        reasons: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Session]:
        """One page of sessions, newest first, filtered (any of several `status`es; created
        `since` an age like `2h` or an ISO time); with `reasons`, each PENDING one says why it
        waits (`reason`).

        A user lists their own sessions; an admin everyone's, or one `owner`'s (a user name).
        """
        params = {
            "status": status,
            "owner": owner,
            "resource_group": resource_group,
            "type": type,
            "array_id": array_id,
            "since": since,
            "reasons": reasons or None,
            "limit": limit,
            "cursor": cursor,
        }
        data = await self._json("GET", "/v1/sessions", params=params)
        return Page[Session].model_validate(data)

    async def iter_sessions(
        self,
        *,
        status: str | Sequence[str] | None = None,
        owner: str | None = None,
        resource_group: str | None = None,
        type: str | None = None,
        array_id: uuid.UUID | str | None = None,
        since: str | None = None,
        reasons: bool = False,
        page_size: int | None = None,
    ) -> AsyncGenerator[Session, None]:
        """Every session `list_sessions` would list, following the cursors page by page."""

        def fetch(cursor: str | None) -> Awaitable[Page[Session]]:
            return self.list_sessions(
                status=status,
                owner=owner,
                resource_group=resource_group,
                type=type,
                array_id=array_id,
                since=since,
                reasons=reasons,
                limit=page_size,
                cursor=cursor,
            )

        async with contextlib.aclosing(every_item(fetch)) as sessions:
            async for session in sessions:
                yield session

    async def get_session(self, session_id: SessionRef) -> Session:
        """The session, with its kernels."""
        return Session.model_validate(await self._json("GET", session_path(session_id)))

    async def resolve_session_id(self, ref: SessionRef) -> uuid.UUID:
        """The id of the session `ref` names: its id, its number, a unique id prefix or name.

        The server resolves it (every session route accepts any of these); a full id needs no
        request. `NotFoundError` when no session of yours answers to it, `ConflictError`
        (naming the candidates' numbers) when a name or prefix fits several.
        """
        if isinstance(ref, uuid.UUID):
            return ref
        with contextlib.suppress(ValueError):
            return uuid.UUID(ref)
        if not ref.strip():
            raise ValidationError(
                "a session reference is empty", errors=[FieldError("session", "empty")]
            )
        return (await self.get_session(ref)).id

    async def terminate_session(self, session_id: SessionRef) -> TerminateResult:
        """Ask the session to end: cancelled if it never ran, else terminated on its agents."""
        data = await self._json("POST", f"{session_path(session_id)}/terminate")
        return TerminateResult.model_validate(data)

    async def activate_session(self, session_id: SessionRef) -> ActivateResult:
        """Put a session deactivated by all-or-nothing admission back in the queue."""
        data = await self._json("POST", f"{session_path(session_id)}/activate")
        return ActivateResult.model_validate(data)

    async def session_attempts(self, session_id: SessionRef) -> Attempts:
        """The attempts of the session's retry chain, oldest first."""
        data = await self._json("GET", f"{session_path(session_id)}/attempts")
        return Attempts.model_validate(data)

    async def retry_settings(self) -> RetrySettings:
        """Whether automatic retries are paused cluster-wide, and the default policy."""
        return RetrySettings.model_validate(await self._json("GET", "/v1/retries"))

    async def set_retries_paused(self, paused: bool, reason: str | None = None) -> RetrySettings:
        """Pause or resume automatic retries cluster-wide (admins)."""
        body = {"paused": paused, "reason": reason}
        return RetrySettings.model_validate(await self._json("PUT", "/v1/retries", json=body))

    async def delete_session(self, session_id: SessionRef) -> None:
        """Remove an ended session and its logs (ConflictError while it has not ended)."""
        await self._send("DELETE", session_path(session_id))

    async def session_logs(
        self,
        session_id: SessionRef,
        *,
        stream: LogStream = "stdout",
        kernel: int | None = None,
        offset: int | None = None,
        tail: int | None = None,
        since: str | None = None,
        timestamps: bool = False,
    ) -> bytes:
        """The session's output as stored so far (see `follow_logs` for the parameters)."""
        params = _log_params(stream, kernel, offset, tail, since, timestamps, follow=False)
        response = await self._send("GET", f"{session_path(session_id)}/logs", params=params)
        return response.content

    async def follow_logs(
        self,
        session_id: SessionRef,
        *,
        stream: LogStream = "stdout",
        kernel: int | None = None,
        offset: int | None = None,
        tail: int | None = None,
        since: str | None = None,
        timestamps: bool = False,
    ) -> AsyncGenerator[bytes, None]:
        """The session's output as it grows; ends when the session has ended.

        Every kernel's (lines prefixed `[kernel N] ` when it has several) unless `kernel`
        names one; one kernel's bytes from `offset`; or the last `tail` lines, of those
        stored `since` (an age like `10m`, or an ISO time); `timestamps` prefixes each line
        with the time it was stored. Close it (`contextlib.aclosing`) when stopping early.
        `UnreachableError` when the manager ends the stream before the session ended (it is
        stopping).
        """
        params = _log_params(stream, kernel, offset, tail, since, timestamps, follow=True)
        async with self._stream("GET", f"{session_path(session_id)}/logs", params) as response:
            async for chunk in response.aiter_bytes():
                yield chunk
        # A stopping manager ends the stream too: only the session's status tells the two apart.
        if not (await self.get_session(session_id)).is_terminal:
            raise UnreachableError(
                f"corral at {self.url} ended the log stream before the session ended "
                "(the manager is stopping); follow it again to see the rest"
            )

    async def session_history(self, session_id: SessionRef) -> list[HistoryEntry]:
        """The session's scheduling phases, oldest first."""
        data = await self._json("GET", f"{session_path(session_id)}/history")
        return [HistoryEntry.model_validate(item) for item in data["items"]]

    async def explain(self, session_id: SessionRef) -> Explanation:
        """Where the session stands in its resource group's queue, and why it waits."""
        data = await self._json("GET", f"{session_path(session_id)}/explain")
        return Explanation.model_validate(data)

    # --- uploads and outputs ---------------------------------------------------------------

    async def upload_directory(self, path: Path | str) -> Upload:
        """Pack a directory (`corral.client.uploads`) and send it unless the server has it.

        The result's `digest` is what a spec's `upload` names; `sent` says whether bytes went.
        """
        packed = await asyncio.to_thread(pack_directory, Path(path))
        try:
            with contextlib.suppress(NotFoundError):
                found = await self._json("GET", f"/v1/uploads/{packed.digest}")
                return Upload.model_validate(found)
            headers = {"Content-Type": "application/gzip"}
            stored = await self._json(
                "PUT",
                f"/v1/uploads/{packed.digest}",
                content=packed.archive.read(),
                headers=headers,
            )
            return Upload.model_validate({**stored, "sent": True})
        finally:
            packed.close()

    async def list_outputs(self, session_id: SessionRef) -> list[OutputFile]:
        """The files the session's kernels wrote to CORRAL_OUTPUT_DIR, by kernel and name."""
        data = await self._json("GET", f"{session_path(session_id)}/outputs")
        return [OutputFile.model_validate(item) for item in data["items"]]

    async def download_output(self, session_id: SessionRef, kernel: int, name: str) -> bytes:
        """One output file of the kernel with that cluster index."""
        path = f"{session_path(session_id)}/outputs/{kernel}/{quote(name)}"
        return (await self._send("GET", path)).content

    async def download_outputs(self, session_id: SessionRef) -> bytes:
        """Every output file as one tar.gz (a `kernel-<index>/` folder each if several)."""
        return (await self._send("GET", f"{session_path(session_id)}/outputs/archive")).content

    # --- agents, events, the caller -------------------------------------------------------

    async def list_agents(
        self,
        *,
        status: str | None = None,
        resource_group: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Agent]:
        """One page of the cluster's agents by id, optionally of one status or resource group."""
        params = {
            "status": status,
            "resource_group": resource_group,
            "limit": limit,
            "cursor": cursor,
        }
        return Page[Agent].model_validate(await self._json("GET", "/v1/agents", params=params))

    async def iter_agents(
        self,
        *,
        status: str | None = None,
        resource_group: str | None = None,
        page_size: int | None = None,
    ) -> AsyncGenerator[Agent, None]:
        """Every agent `list_agents` would list, following the cursors page by page."""

        def fetch(cursor: str | None) -> Awaitable[Page[Agent]]:
            return self.list_agents(
                status=status, resource_group=resource_group, limit=page_size, cursor=cursor
            )

        async with contextlib.aclosing(every_item(fetch)) as agents:
            async for agent in agents:
                yield agent

    async def events(
        self,
        *,
        since: int | None = None,
        entity_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        tail: int | None = None,
    ) -> Page[Event]:
        """One page of the events the caller may see, oldest first, after event id `since`
        (`tail`: the last N of them, in one page)."""
        params = {
            "follow": "false",
            "since": since,
            "entity_id": entity_id,
            "limit": limit,
            "cursor": cursor,
            "tail": tail,
        }
        return Page[Event].model_validate(await self._json("GET", "/v1/events", params=params))

    async def follow_events(
        self, *, since: int | None = None, entity_id: str | None = None
    ) -> AsyncGenerator[Event, None]:
        """Events as they happen, after event id `since` if given (else from now); until closed.

        `entity_id` keeps one entity's events (e.g. a session id). Close the iterator
        (`contextlib.aclosing`) when stopping.
        """
        params = {"since": since, "entity_id": entity_id}
        headers = {"Accept": "text/event-stream"}
        async with self._stream("GET", "/v1/events", params, headers) as response:
            async for message in parse_sse(response.aiter_lines()):
                if message.data:
                    yield Event.model_validate_json(message.data)
        # The server ends a followed stream only when the manager stops or the token is no
        # longer good: either way the events stop here, which the caller must hear.
        raise UnreachableError(
            f"corral at {self.url} ended the event stream (the manager is stopping, or the "
            "token is no longer valid); follow again from the last event's id"
        )

    async def me(self) -> User:
        """The user the token belongs to."""
        return User.model_validate(await self._json("GET", "/v1/me"))


def validate_spec(fields: Mapping[str, Any]) -> SessionSpec:
    """The session spec of `fields`, or `ValidationError` naming each bad field (no request)."""
    return validated(SessionSpec, fields)


def validated(model: type[SpecT], fields: Mapping[str, Any]) -> SpecT:
    """`fields` as a `model` of the session spec (`SessionSpec`, `ArraySpec`, a job file's),
    or `ValidationError` naming each bad field (no request)."""
    try:
        return model.model_validate(fields)
    except pydantic.ValidationError as exc:
        errors = field_errors(exc)
        raise ValidationError(
            describe(errors),
            type=VALIDATION_PROBLEM,
            title="The session spec is not valid",
            errors=errors,
        ) from None


def _log_params(
    stream: LogStream,
    kernel: int | None,
    offset: int | None,
    tail: int | None,
    since: str | None,
    timestamps: bool,
    *,
    follow: bool,
) -> dict[str, object]:
    return {
        "stream": stream,
        "kernel": kernel,
        "offset": offset,
        "tail": tail,
        "since": since,
        "timestamps": timestamps or None,
        "follow": follow or None,
    }
