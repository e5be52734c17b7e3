"""An in-memory stand-in for the manager's REST API, served to the SDK by httpx.MockTransport.

It answers like the real routes (problem details, `{items, next_cursor}` pages, chunked logs
that end when the session ends, Server-Sent Events) and records every request. Tests move a
session along with `move()` and `finish()`; followers wait on conditions, never on time.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from corral.client import Client
from corral.client._http import Answer, PlainCall

URL = "http://manager.test"
TOKEN = "secret-token"
NOW = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
PROBLEMS = "https://corral.dev/problems/"
TERMINAL = {"TERMINATED", "CANCELLED", "ERROR"}

Route = Callable[..., Awaitable[httpx.Response]]


def problem(status: int, kind: str, detail: str, **extra: Any) -> httpx.Response:
    """A problem-details answer, as the API sends it."""
    body = {"type": PROBLEMS + kind, "title": kind.replace("-", " "), "status": status}
    return httpx.Response(
        status,
        json={**body, "detail": detail, **extra},
        headers={"Content-Type": "application/problem+json"},
    )


def session_json(**fields: Any) -> dict[str, Any]:
    """A session as the API shows it (a PENDING one-kernel batch unless overridden)."""
    session_id = str(fields.pop("id", uuid.uuid4()))
    base: dict[str, Any] = {
        "id": session_id,
        "number": 1,
        "name": None,
        "owner": "alice",
        "type": "BATCH",
        "status": "PENDING",
        "status_info": None,
        "status_changed_at": NOW.isoformat(),
        "created_at": NOW.isoformat(),
        "started_at": None,
        "terminated_at": None,
        "result": None,
        "failure_cause": None,
        "exit_code": None,
        "resource_group": "default",
        "cluster_mode": "single-node",
        "cluster_size": 1,
        "priority": 0,
        "image": "python",
        "command": ["python", "-c", "print(42)"],
        "resources": {"cpu": 1, "mem": 1024**3},
        "creation_id": None,
        "kernels": [kernel_json(0)],
        "reason": None,
    }
    return {**base, **fields}


def kernel_json(index: int, **fields: Any) -> dict[str, Any]:
    """A kernel as the API shows it."""
    return {
        "id": str(uuid.uuid4()),
        "cluster_role": "main" if index == 0 else "sub",
        "cluster_index": index,
        "agent_id": None,
        "status": "PENDING",
        "status_info": None,
        "exit_code": None,
        "failure_cause": None,
        "runtime_info": {},
        "status_changed_at": NOW.isoformat(),
        **fields,
    }


def agent_json(agent_id: str, **fields: Any) -> dict[str, Any]:
    """An agent as the API shows it (slots both human-readable and in milli-units)."""
    return {
        "id": agent_id,
        "address": f"{agent_id}.local",
        "resource_group": "default",
        "status": "ALIVE",
        "schedulable": True,
        "runtime": "process",
        "labels": {},
        "last_heartbeat_at": NOW.isoformat(),
        "status_changed_at": NOW.isoformat(),
        "created_at": NOW.isoformat(),
        "capacity": {"cpu": 8, "mem": 16 * 1024**3},
        "occupied": {"cpu": 1},
        "kernels": 1,
        **fields,
    }


class FakeApi:
    """The API's routes over dictionaries; `client()` is an SDK client wired to it."""

    def __init__(self, *, role: str = "user", page_size: int = 100) -> None:
        self.role = role
        self.page_size = page_size
        self.sessions: dict[str, dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], bytes] = {}
        self.history: dict[str, list[dict[str, Any]]] = {}
        self.agents: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []  # the bodies of POST /v1/sessions
        self.requests: list[httpx.Request] = []
        self.events_available = True
        # True: an event stream ends after what is already recorded, as a stopping manager's
        self.events_end = False
        self.explanation_message = "no agent has 8 cpu free"
        # Runs when a session's stdout is followed: what the "cluster" does meanwhile.
        self.on_follow: Callable[[str], Awaitable[None]] | None = None
        self.on_terminate: Callable[[str], Awaitable[None]] | None = None
        # Runs when an event stream opens, with its entity filter.
        self.on_events: Callable[[str | None], Awaitable[None]] | None = None
        self._changed: asyncio.Condition | None = None
        self._delivered = 0  # events a follower has consumed
        self._routes: list[tuple[str, re.Pattern[str], Route]] = [
            ("POST", re.compile(r"/v1/sessions"), self._create),
            ("GET", re.compile(r"/v1/sessions"), self._list),
            ("GET", re.compile(r"/v1/sessions/([^/]+)"), self._get),
            ("DELETE", re.compile(r"/v1/sessions/([^/]+)"), self._delete),
            ("POST", re.compile(r"/v1/sessions/([^/]+)/terminate"), self._terminate),
            ("POST", re.compile(r"/v1/sessions/([^/]+)/activate"), self._activate),
            ("GET", re.compile(r"/v1/sessions/([^/]+)/logs"), self._logs),
            ("GET", re.compile(r"/v1/sessions/([^/]+)/history"), self._history),
            ("GET", re.compile(r"/v1/sessions/([^/]+)/explain"), self._explain),
            ("GET", re.compile(r"/v1/agents"), self._agents),
            ("GET", re.compile(r"/v1/events"), self._events),
            ("GET", re.compile(r"/v1/me"), self._me),
        ]

    def client(self) -> Client:
        """An SDK client whose requests this fake answers."""
        return Client(URL, TOKEN, transport=httpx.MockTransport(self.handle))

    def plain_call(self) -> PlainCall:
        """A one-request client (`corral run --detach`'s) whose request this fake answers."""
        return PlainCall(URL, TOKEN, send=self.plain_send)

    def plain_send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        """`PlainCall`'s way to the network, answered by this fake."""
        request = httpx.Request(method, url, headers=dict(headers), content=body)
        response = self.handle_now(request)
        return Answer(response.status_code, response.reason_phrase, response.read())

    def handle_now(self, request: httpx.Request) -> httpx.Response:
        """`handle`, for a synchronous client (no event loop is running)."""
        return asyncio.run(self.handle(request))

    def add_session(self, **fields: Any) -> str:
        """Store a session (see `session_json`), numbered after the last; its id."""
        number = max((s["number"] for s in self.sessions.values()), default=0) + 1
        session = session_json(**{"number": number, **fields})
        self.sessions[session["id"]] = session
        return str(session["id"])

    def find(self, ref: str) -> str | httpx.Response:
        """The id of the session `ref` names (as `store.session_refs` reads it), or the 404 or
        409 problem the API answers."""
        if ref in self.sessions:
            return ref
        by_number = [i for i, s in self.sessions.items() if str(s["number"]) == ref]
        named = [i for i, s in self.sessions.items() if s["name"] == ref]
        prefixed = [i for i in self.sessions if i.replace("-", "").startswith(ref.replace("-", ""))]
        for found in (by_number, named, prefixed):
            if len(found) > 1:
                numbers = ", ".join(str(self.sessions[i]["number"]) for i in found)
                candidates = [{"number": self.sessions[i]["number"], "id": i} for i in found]
                return problem(
                    409,
                    "session-ambiguous",
                    f"{ref!r} fits several sessions ({numbers}); give the session's number",
                    candidates=candidates,
                )
            if found:
                return found[0]
        return _no_session(ref)

    async def move(self, session_id: str, status: str, reason: str = "") -> None:
        """Change a session's status, recording a `session.status_changed` event."""
        session = self.sessions[session_id]
        before, session["status"] = session["status"], status
        for kernel in session["kernels"]:
            kernel["status"] = status
        await self.emit(
            "session.status_changed", session_id, {"from": before, "to": status, "reason": reason}
        )

    async def finish(
        self, session_id: str, status: str = "TERMINATED", exit_code: int | None = 0, **fields: Any
    ) -> None:
        """End a session with an exit code (which ends its followed logs), and the result the
        manager would give it unless one is given."""
        session = self.sessions[session_id]
        ok = status == "TERMINATED" and exit_code == 0
        fields.setdefault(
            "result", "success" if ok else "cancelled" if status == "CANCELLED" else "failure"
        )
        session.update(exit_code=exit_code, **fields)
        session["kernels"][0]["exit_code"] = exit_code
        await self.move(session_id, status)

    async def emit(self, kind: str, entity_id: str, payload: dict[str, Any]) -> None:
        """Record an event; a live follower receives it."""
        self.events.append(
            {
                "id": len(self.events) + 1,
                "kind": kind,
                "entity_type": "session",
                "entity_id": entity_id,
                "owner_id": None,
                "payload": payload,
                "created_at": NOW.isoformat(),
            }
        )
        await self._notify()

    async def delivered(self) -> None:
        """Wait until a follower of the event stream has consumed every event."""
        changed = self._condition()
        async with changed:
            await changed.wait_for(lambda: self._delivered >= len(self.events))

    async def until(self, condition: Callable[[], object]) -> None:
        """Wait until `condition()` holds (checked on every request and every change)."""
        changed = self._condition()
        async with changed:
            await changed.wait_for(condition)

    def sent(self, method: str, path: str) -> list[httpx.Request]:
        """The requests made to `method path`."""
        return [r for r in self.requests if r.method == method and r.url.path == path]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer `request` as the API would."""
        self.requests.append(request)
        await self._notify()
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return problem(401, "unauthenticated", "the token is unknown or expired")
        for method, pattern, route in self._routes:
            match = pattern.fullmatch(request.url.path)
            if match and request.method == method:
                if not match.groups():
                    return await route(request)
                found = self.find(match.group(1))  # every session route takes a reference
                if isinstance(found, httpx.Response):
                    return found
                return await route(request, found)
        return problem(404, "not-found", "Not Found")

    # --- routes -----------------------------------------------------------------------------

    async def _create(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.created.append(body)
        for session in self.sessions.values():
            if body.get("creation_id") and session["creation_id"] == body["creation_id"]:
                return httpx.Response(200, json=session)
        size = body.get("cluster_size", 1)
        session_id = self.add_session(
            name=body.get("name"),
            image=body["image"],
            command=body["command"],
            cluster_size=size,
            creation_id=body.get("creation_id"),
            kernels=[kernel_json(i) for i in range(size)],
        )
        return httpx.Response(201, json=self.sessions[session_id])

    async def _list(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        statuses = params.get_list("status")
        owner = params.get("owner")
        rows = [
            {k: v for k, v in s.items() if k != "kernels"}
            for s in reversed(self.sessions.values())
            if (not statuses or s["status"] in statuses) and (owner is None or s["owner"] == owner)
        ]
        return self._page(request, rows)

    async def _get(self, request: httpx.Request, session_id: str) -> httpx.Response:
        if session_id not in self.sessions:
            return _no_session(session_id)
        return httpx.Response(200, json=self.sessions[session_id])

    async def _delete(self, request: httpx.Request, session_id: str) -> httpx.Response:
        session = self.sessions.get(session_id)
        if session is None:
            return _no_session(session_id)
        if session["status"] not in TERMINAL:
            return problem(409, "session-not-ended", f"session {session_id} has not ended")
        del self.sessions[session_id]
        return httpx.Response(204)

    async def _activate(self, request: httpx.Request, session_id: str) -> httpx.Response:
        """As the manager: a deactivated PENDING session goes back in the queue."""
        session = self.sessions.get(session_id)
        if session is None:
            return _no_session(session_id)
        inactive = session["status"] == "PENDING" and session.get("active") is False
        body: dict[str, Any] = {
            "id": session_id,
            "number": session["number"],
            "outcome": "activated" if inactive else "unchanged",
            "status": session["status"],
        }
        if inactive:
            session.update(active=True, requeue_count=0, requeue_at=None, deactivated_at=None)
        else:
            body["message"] = "it is not deactivated"
        return httpx.Response(200, json=body)

    async def _terminate(self, request: httpx.Request, session_id: str) -> httpx.Response:
        session = self.sessions.get(session_id)
        if session is None:
            return _no_session(session_id)
        outcome = "unchanged" if session["status"] in TERMINAL else "terminating"
        if outcome == "terminating":
            await self.move(session_id, "TERMINATING", "user request")
            if self.on_terminate is not None:
                await self.on_terminate(session_id)
        body = {
            "id": session_id,
            "number": session["number"],
            "outcome": outcome,
            "status": session["status"],
        }
        return httpx.Response(200, json=body)

    async def _logs(self, request: httpx.Request, session_id: str) -> httpx.Response:
        if session_id not in self.sessions:
            return _no_session(session_id)
        params = request.url.params
        key = (session_id, params.get("stream", "stdout"))
        offset = int(params.get("offset", "0"))
        if params.get("follow") != "true":
            return httpx.Response(200, content=self.logs.get(key, b"")[offset:])

        async def chunks() -> AsyncIterator[bytes]:
            if key[1] == "stdout" and self.on_follow is not None:
                await self.on_follow(session_id)
            changed = self._condition()
            async with changed:
                await changed.wait_for(lambda: self.sessions[session_id]["status"] in TERMINAL)
            data = self.logs.get(key, b"")[offset:]
            if data:
                yield data

        return httpx.Response(200, content=chunks())

    async def _history(self, request: httpx.Request, session_id: str) -> httpx.Response:
        if session_id not in self.sessions:
            return _no_session(session_id)
        return httpx.Response(200, json={"items": self.history.get(session_id, [])})

    async def _explain(self, request: httpx.Request, session_id: str) -> httpx.Response:
        session = self.sessions.get(session_id)
        if session is None:
            return _no_session(session_id)
        pending = session["status"] == "PENDING"
        body = {
            "session_id": session_id,
            "number": session["number"],
            "status": session["status"],
            "resource_group": session["resource_group"],
            "position": 1 if pending else None,
            "queue_length": 2 if pending else 1,
            "outcome": "waiting" if pending else "not_pending",
            "code": "no_capacity" if pending else None,
            "message": self.explanation_message if pending else "the session is not pending",
        }
        return httpx.Response(200, json=body)

    async def _agents(self, request: httpx.Request) -> httpx.Response:
        return self._page(request, self.agents)

    async def _events(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        since = int(params.get("since", "0"))
        entity = params.get("entity_id")
        if params.get("follow") == "false":
            rows = [
                e
                for e in self.events
                if e["id"] > since and (entity is None or e["entity_id"] == entity)
            ]
            if "tail" in params:
                return httpx.Response(
                    200, json={"items": rows[-int(params["tail"]) :], "next_cursor": None}
                )
            return self._page(request, rows)
        if not self.events_available:
            return problem(503, "event-stream-unavailable", "this manager has no event bus")

        async def frames() -> AsyncIterator[bytes]:
            yield b": connected\n\n"
            if self.on_events is not None:
                await self.on_events(entity)
            position = since if "since" in params else len(self.events)
            changed = self._condition()
            while True:
                while position < len(self.events):
                    event = self.events[position]
                    position += 1
                    if entity is None or event["entity_id"] == entity:
                        frame = f"id: {event['id']}\nevent: {event['kind']}\n"
                        yield f"{frame}data: {json.dumps(event)}\n\n".encode()
                # Resumed: the follower consumed everything sent so far.
                self._delivered = position
                await self._notify()
                if self.events_end:
                    return
                async with changed:
                    await changed.wait_for(lambda: len(self.events) > self._delivered)

        return httpx.Response(200, content=frames(), headers={"Content-Type": "text/event-stream"})

    async def _me(self, request: httpx.Request) -> httpx.Response:
        user = {"id": str(uuid.UUID(int=1)), "name": "alice", "role": self.role}
        return httpx.Response(200, json=user)

    # --- helpers ----------------------------------------------------------------------------

    def _page(self, request: httpx.Request, rows: list[dict[str, Any]]) -> httpx.Response:
        limit = min(int(request.url.params.get("limit", self.page_size)), self.page_size)
        start = int(request.url.params.get("cursor", "0"))
        end = start + limit
        next_cursor = str(end) if end < len(rows) else None
        return httpx.Response(200, json={"items": rows[start:end], "next_cursor": next_cursor})

    def _condition(self) -> asyncio.Condition:
        # One per event loop: a CLI test runs each command in its own asyncio.run.
        loop = asyncio.get_running_loop()
        if self._changed is None or getattr(self, "_loop", None) is not loop:
            self._changed = asyncio.Condition()
            self._loop = loop
        return self._changed

    async def _notify(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()


def _no_session(session_id: str) -> httpx.Response:
    return problem(404, "session-not-found", f"no session {session_id}")
