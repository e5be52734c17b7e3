"""The proxy's ASGI app: a request for a deployment goes to one of its healthy replicas,
request and response bodies streamed both ways (server-sent events and chunked answers pass
chunk by chunk).

Which deployment: with a `domain`, a `Host:` of `<deployment>.<domain>` names it and the whole
path goes to the replica; otherwise the path's first segment does, `/<deployment>/<path>` going
to `<path>`. A deployment is named by its name or its id. Who may pass: a deployment whose
access is by token asks for `Authorization: Bearer <its token>` (401 otherwise), and that
header stays at the proxy; an open one lets anyone through. A replica that cannot be connected
to is skipped for the next; with none left (or none healthy) the answer is a 503 problem.
`GET /metrics` (not through a deployment's host name) is the proxy's own Prometheus metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from corral.domain.deployment import DeploymentAccess
from corral.proxy.metrics import UNKNOWN_DEPLOYMENT, ProxyMetrics
from corral.proxy.table import AmbiguousNameError, Deployment, RouteTable
from corral.proxy.upstream import (
    HOP_BY_HOP,
    Answer,
    ReplicaFailedError,
    ReplicaUnreachableError,
    Upstream,
    request_head,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PROBLEM_BASE = "https://corral.dev/problems/"
METRICS_PATH = b"/metrics"
# Requests asked again of another replica when one breaks before answering (RFC 9110 9.2.1:
# safe methods; a POST the first replica may have acted on is not).
_SAFE_TO_RETRY = frozenset({"GET", "HEAD", "OPTIONS"})
_NO_CONTENT = {"type": "http.response.body", "body": b"", "more_body": False}


class ProxyApp:
    """Forwards requests by the route table; one pool of connections for every replica."""

    def __init__(
        self,
        table: RouteTable,
        *,
        domain: str | None = None,
        timeout_s: float = 300.0,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.table = table
        # `.domain`, lowercase: the suffix of the host names that name deployments.
        self._suffix = None if domain is None else "." + domain.strip(".").lower()
        self.metrics = metrics if metrics is not None else ProxyMetrics()
        # No read timeout of our own beyond `timeout_s`: a model may think before it answers.
        self._upstream = Upstream(timeout_s=timeout_s)

    async def aclose(self) -> None:
        """Close the connections to the replicas."""
        await self._upstream.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        started = time.perf_counter()
        # One pass over the headers: those passed on, and those the proxy itself reads.
        forwarded: list[bytes] = []
        host = authorization = None
        length: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"host":
                host = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            if name not in HOP_BY_HOP:
                forwarded.append(b"%b: %b\r\n" % (name, value))
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        ref = self._host_deployment(host)
        if ref is None:
            if raw_path == METRICS_PATH:
                await _metrics(send, self.metrics)
                return
            ref_bytes, _, rest = raw_path[1:].partition(b"/")
            ref = ref_bytes.decode("latin-1")
            target = b"/" + rest
        else:
            target = raw_path
        query: bytes = scope.get("query_string", b"")
        if query:
            target += b"?" + query
        heads: list[float] = []  # when the answer's head went out (a replica's answer)
        deployment_id, code = await self._forward(
            scope, receive, send, ref, target, forwarded, authorization, length, chunked, heads
        )
        answered = heads[0] if heads else time.perf_counter()
        self.metrics.observe(deployment_id, code, answered - started)

    def _host_deployment(self, host: bytes | None) -> str | None:
        """The deployment a `Host:` of `<deployment>.<domain>` names; None for another host."""
        if self._suffix is None or host is None:
            return None
        name = host.decode("latin-1").lower()
        if ":" in name and not name.endswith("]"):  # a port (a bare IPv6 address ends in ])
            name = name.rpartition(":")[0]
        if not name.endswith(self._suffix):
            return None
        ref = name[: -len(self._suffix)]
        return ref if ref and "." not in ref else None

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ref: str,
        target: bytes,
        forwarded: list[bytes],
        authorization: bytes | None,
        length: bytes | None,
        chunked: bool,
        heads: list[float],
    ) -> tuple[str, int]:
        """Answer the request for deployment `ref`; (deployment id, status sent)."""
        try:
            deployment = self.table.find(ref)
        except AmbiguousNameError:
            await _problem(
                send, 409, "ambiguous-deployment", f"several deployments are named {ref!r}; "
                "name yours by its id (`corral deploy info` shows it)",
            )  # fmt: skip
            return UNKNOWN_DEPLOYMENT, 409
        if deployment is None or not deployment.backends:
            await _problem(
                send, 503, "no-healthy-replica",
                f"deployment {ref!r} has no healthy replica now (or does not exist); "
                "`corral deploy info` shows its replicas",
            )  # fmt: skip
            return UNKNOWN_DEPLOYMENT if deployment is None else deployment.id, 503
        if not deployment.admits(authorization):
            await _unauthorized(send, ref, authorization is not None)
            return deployment.id, 401
        if authorization is not None and deployment.access is DeploymentAccess.TOKEN:
            # The deployment's token opened the door: it is the proxy's, not the replica's.
            forwarded = [h for h in forwarded if not h.startswith(b"authorization:")]
        if chunked:
            forwarded.append(b"transfer-encoding: chunked\r\n")
        elif length is not None:
            forwarded.append(b"content-length: %b\r\n" % length)
        has_body = chunked or (length is not None and length.strip() != b"0")
        return deployment.id, await self._to_replicas(
            deployment, scope, receive, send, target, forwarded, has_body, chunked, heads
        )

    async def _to_replicas(
        self,
        deployment: Deployment,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: bytes,
        headers: list[bytes],
        has_body: bool,
        chunked: bool,
        heads: list[float],
    ) -> int:
        """Try the deployment's replicas in turn until one answers; the status sent."""
        method: str = scope["method"]
        streamed = _Body(receive)
        started: list[int] = []

        async def send_start(answer: Answer) -> None:
            started.append(answer.status)
            await send(
                {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
            )
            heads.append(time.perf_counter())

        async def send_body(chunk: bytes, more: bool) -> None:
            if more or chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": more})
            else:
                await send(_NO_CONTENT)

        for backend in deployment.candidates():
            if streamed.started:
                break  # the body went with the first attempt: cannot retry
            backend.outstanding += 1
            try:
                request = request_head(method, target, backend.address, headers)
                await self._upstream.exchange(
                    backend.address,
                    request,
                    streamed.stream() if has_body else None,
                    send_start,
                    send_body,
                    chunked=chunked,
                    no_body=method == "HEAD",
                )
                return started[0]
            except ReplicaUnreachableError:
                continue  # this replica is down: the next one
            except (ReplicaFailedError, OSError, TimeoutError) as exc:
                if started:
                    # The answer's head went out: the client sees the body cut short.
                    return started[0]
                if not has_body and method in _SAFE_TO_RETRY and not isinstance(exc, TimeoutError):
                    # The replica broke before answering (killed as it was asked): a request
                    # that changes nothing is asked of the next one.
                    continue
                timed_out = isinstance(exc, TimeoutError)
                code = 504 if timed_out else 502
                kind = "replica-timeout" if timed_out else "replica-failed"
                await _problem(send, code, kind, f"the replica failed: {exc or type(exc).__name__}")
                return code
            finally:
                backend.outstanding -= 1
        await _problem(
            send, 503, "no-healthy-replica",
            f"no replica of deployment {deployment.id!r} could be reached",
        )  # fmt: skip
        return 503


class _Body:
    """The request's body, read from the client as the replica takes it."""

    __slots__ = ("_receive", "started")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.started = False

    async def stream(self) -> AsyncIterator[bytes]:
        """The body's chunks as they come."""
        self.started = True
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return


async def _unauthorized(send: Send, ref: str, had_credentials: bool) -> None:
    detail = (
        f"deployment {ref!r} asks for its token, and this is not it"
        if had_credentials
        else f"deployment {ref!r} asks for its token: send `Authorization: Bearer TOKEN` "
        f"(`corral deploy token {ref}` makes a new one)"
    )
    await _problem(
        send,
        401,
        "deployment-token-required",
        detail,
        [(b"www-authenticate", b'Bearer realm="corral"')],
    )


async def _problem(
    send: Send,
    status: int,
    kind: str,
    detail: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = json.dumps(
        {"type": PROBLEM_BASE + kind, "title": kind.replace("-", " ").capitalize(),
         "status": status, "detail": detail}
    ).encode()  # fmt: skip
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or ()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _metrics(send: Send, metrics: ProxyMetrics) -> None:
    body = metrics.render()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE_LATEST.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
