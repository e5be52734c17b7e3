"""`corral manager`: one manager process — store, buses, coordinator loops, API server.

Start-up: open the database and bring its schema to head, open the hint/lock/event buses,
build the controllers and the session coordinator, then run side by side the coordinator's
dual loops (plus the lost-agent sweep), the long-poll waker and the HTTP server. Shutdown (on
`stop()` or when any of them dies): stop accepting requests, stop the loops (grace period, then
cancellation), close the buses and the database; a crash is re-raised.

Every component waits out an outage of the database or Redis on its own (retrying with backoff,
logging each outage once; `/readyz` answers 503 meanwhile), so a component that ends is a bug:
it is logged critical with its traceback and the process exits non-zero. A manager started
during an outage waits for PostgreSQL and Redis before it listens (`manager.waiting_for_servers`,
then `manager.servers_reachable`), so a restarted manager is not a crash loop that a supervisor
gives up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from corral.api.app import ApiContext, create_app
from corral.api.uploads import DEFAULT_UPLOAD_MAX_BYTES
from corral.controller.agents import AgentController, AgentTimings
from corral.controller.deployments import DeploymentController
from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.coordination.loop import DualLoop
from corral.coordination.manager import LoopIntervals, task_loops
from corral.coordination.metrics import CoordinatorMetrics
from corral.coordination.orchestrator import Orchestrator
from corral.coordination.serving import serving_coordinators
from corral.coordination.tasks import Task, TaskRun
from corral.domain.arrays import DEFAULT_MAX_ARRAY_SIZE
from corral.domain.bounds import DEFAULT_MAX_REQUEST_BYTES
from corral.domain.record import record
from corral.domain.retry.policy import RetryPolicy
from corral.domain.slots import ResourceSlots
from corral.domain.tokens import DEFAULT_TOKEN_TTL_S
from corral.domain.types import Clock, utcnow
from corral.infra import DEFAULT_PREFIX
from corral.infra._backoff import reconnect_delays
from corral.infra.events import PING_INTERVAL_S, forget_on_events
from corral.infra.locks import DEFAULT_LOCK_TTL_S, address_owner
from corral.manager._http_server import QuietServer
from corral.manager.backends import Buses, open_buses
from corral.manager.retention import retention_loop
from corral.store.database import Database
from corral.store.events import TOKEN_CHANGES
from corral.store.group_options import forget_group_options
from corral.store.kernel_logs import DEFAULT_LOG_CAP_BYTES
from corral.store.migrate import upgrade
from corral.store.resource_group_store import GROUP_CHANGES
from corral.store.retention import DEFAULT_RETENTION_DAYS
from corral.store.unavailable import database_unavailable
from corral.store.uploads import DEFAULT_UNUSED_UPLOAD_HOURS

logger = logging.getLogger(__name__)

SWEEP_TASK = "DetectLostAgents"
SWEEP_HINT = "agents-sweep"
# An idle HTTP connection is kept this much longer than the agents' heartbeat interval.
KEEP_ALIVE_MARGIN_S = 5.0
# A server down when the manager starts is tried again after 0.1 s, doubling to 1 s, so the
# manager comes up within about a second of its return (when every manager was restarted during
# the outage, the first to come up is when progress resumes).
START_RETRY_MIN_S = 0.1
START_RETRY_MAX_S = 1.0
# Clears this manager's caches when any manager changes what they hold: the API's token cache
# on a revocation, the kept resource-group options on a group's change.
_CACHE_WATCH_TASK = "manager-cache-watch"


@record
class ManagerConfig:
    """What a manager process needs to know."""

    database_url: str
    redis_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8470  # 0: any free port (see `ManagerDaemon.url` once ready)
    # HTTPS with this certificate (PEM, its chain after it) and key; both or neither.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    join_token: str | None = None
    prefix: str = DEFAULT_PREFIX
    timings: AgentTimings = field(default_factory=AgentTimings)
    intervals: LoopIntervals = field(default_factory=LoopIntervals)
    grace_period_s: float = 10.0
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES  # per kernel and stream; 0: no cap
    retention_days: float = DEFAULT_RETENTION_DAYS  # ended sessions kept; 0: for ever
    unused_upload_hours: float = DEFAULT_UNUSED_UPLOAD_HOURS  # uploads no session names; 0: ever
    lock_ttl_s: float = DEFAULT_LOCK_TTL_S
    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE  # elements of one job array
    upload_max_bytes: int = DEFAULT_UPLOAD_MAX_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # one request body (413 past it)
    max_kernel_slots: ResourceSlots | None = None  # the most of each slot a kernel may ask
    # The cluster default of every session's retry policy (`domain.retry.policy`).
    retry_policy_default: RetryPolicy = field(default_factory=RetryPolicy)
    token_ttl_s: float | None = DEFAULT_TOKEN_TTL_S  # users' new tokens; None: never expire


@dataclass(slots=True)
class ManagerParts:
    """The running manager's components (for tests and for `corral up`)."""

    db: Database
    buses: Buses
    sessions: SessionController
    agents: AgentController
    coordinator: SessionCoordinator
    orchestrator: Orchestrator


class ManagerDaemon:
    """Runs one manager until `stop()`; `ready` is set once the API listens."""

    def __init__(self, config: ManagerConfig, *, clock: Clock = utcnow) -> None:
        self.config = config
        self.clock = clock
        self.ready = asyncio.Event()
        self.parts: ManagerParts | None = None
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._stopping = asyncio.Event()

    @property
    def url(self) -> str:
        """The API's base URL (the bound port when configured with port 0)."""
        if self._sock is None:
            raise RuntimeError("the manager is not listening yet; await `ready` first")
        host, port = self._sock.getsockname()[:2]
        scheme = "https" if self.config.tls_cert is not None else "http"
        return f"{scheme}://{host}:{port}"

    async def run(self) -> None:
        """Run until stop() or until a component dies (its error is re-raised)."""
        db = Database.open(self.config.database_url)
        try:
            async with AsyncExitStack() as stack:
                buses = await self._start_when_reachable(db, stack)
                if buses is not None:
                    await self._serve(db, buses)
        finally:
            await db.close()

    async def _start_when_reachable(self, db: Database, stack: AsyncExitStack) -> Buses | None:
        """Bring the schema to head and open the buses (closed by `stack`). While PostgreSQL or
        Redis cannot be reached (`_server_unavailable`), wait and try again, as a running
        manager waits out an outage, so a manager restarted during one comes up when it ends;
        the wait is logged once. None: stopped while waiting."""
        config = self.config
        # The event listener's keep-alive ping waits for the long loop: an idle manager sends
        # nothing between long loops (DESIGN.md, performance targets).
        ping_s = max(PING_INTERVAL_S, config.intervals.long_interval_s)
        delays = reconnect_delays(START_RETRY_MIN_S, START_RETRY_MAX_S)
        began = time.monotonic()
        waited = False
        while True:
            try:
                await upgrade(db)
                buses = await stack.enter_async_context(
                    open_buses(
                        db,
                        config.redis_url,
                        config.prefix,
                        ping_interval_s=ping_s,
                        lock_ttl_s=config.lock_ttl_s,
                    )
                )
            except Exception as exc:
                if not _server_unavailable(db, exc):
                    raise
                delay_s = next(delays)
                if not waited:
                    waited = True
                    error = f"{type(exc).__name__}: {exc}"
                    extra = {"error": error, "retry_in_s": round(delay_s, 2)}
                    logger.warning("manager.waiting_for_servers", extra=extra)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay_s)
                if self._stopping.is_set():
                    return None
                continue
            if waited:
                extra = {"waited_s": round(time.monotonic() - began, 1)}
                logger.info("manager.servers_reachable", extra=extra)
            return buses

    async def stop(self) -> None:
        """Ask the manager to stop; returns at once (await run() for the end). Idempotent."""
        self._stopping.set()

    async def start(self) -> asyncio.Task[None]:
        """Run in the background; return its task once the API listens.

        If the manager ends before it listens (a port taken, a schema it cannot upgrade), its
        error is raised here; a server it waits for (`_start_when_reachable`) is not an error.
        Stopped while it waited, the task returned has ended and `ready` is not set.
        """
        runner = asyncio.create_task(self.run(), name="manager")
        ready = asyncio.create_task(self.ready.wait(), name="manager-ready")
        try:
            await asyncio.wait({runner, ready}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self.ready.is_set():
            await runner  # raises what stopped it
            if not self._stopping.is_set():
                raise RuntimeError("the manager stopped before it listened")
        return runner

    async def _serve(self, db: Database, buses: Buses) -> None:
        config = self.config
        metrics = CoordinatorMetrics()
        coordinator = SessionCoordinator(
            db, buses.hints, buses.events, clock=self.clock, metrics=metrics
        )
        agents = AgentController(
            db,
            buses.hints,
            join_token=config.join_token,
            timings=config.timings,
            clock=self.clock,
            promote=coordinator.promote_reported,
            log_cap_bytes=config.log_cap_bytes or None,
        )
        session_controller = SessionController(
            db,
            buses.hints,
            buses.events,
            clock=self.clock,
            max_array_size=config.max_array_size,
            max_kernel_slots=config.max_kernel_slots,
            retry_default=config.retry_policy_default,
        )
        serving = serving_coordinators(
            db, buses.hints, buses.events, session_controller, clock=self.clock, metrics=metrics
        )
        loops = task_loops(
            [*coordinator.tasks(), *serving[0].tasks(), *serving[1].tasks()],
            buses.hints,
            buses.locks,
            config.intervals,
        )
        loops.append(_sweep_loop(agents, buses, config))
        retention = retention_loop(
            db,
            buses.hints,
            buses.locks,
            retention_days=config.retention_days,
            unused_upload_hours=config.unused_upload_hours,
            clock=self.clock,
            prefix=config.prefix,
            every_s=config.intervals.long_interval_s,
        )
        if retention is not None:
            loops.append(retention)
        orchestrator = Orchestrator(loops, grace_period_s=config.grace_period_s)
        self.parts = ManagerParts(
            db,
            buses,
            session_controller,
            agents,
            coordinator,
            orchestrator,
        )
        app = create_app(
            ApiContext(
                db=db,
                agents=agents,
                sessions=self.parts.sessions,
                events=buses.events,
                loops=loops,
                metrics=metrics,
                upload_max_bytes=config.upload_max_bytes,
                max_request_bytes=config.max_request_bytes,
                token_ttl_s=config.token_ttl_s,
                deployments=DeploymentController(db, buses.hints, buses.events, clock=self.clock),
            )
        )
        served = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            # An agent's connection outlives the pause between its heartbeats (uvicorn's 5 s
            # did not: a new connection, with its TLS handshake, for every heartbeat).
            timeout_keep_alive=int(config.timings.heartbeat_interval_s + KEEP_ALIVE_MARGIN_S),
            timeout_graceful_shutdown=max(1, int(config.grace_period_s)),
            ssl_certfile=config.tls_cert,
            ssl_keyfile=config.tls_key,
        )
        _load_tls(served, config)
        self._sock = _bind(config.host, config.port)
        # Bound: no earlier process of this address lives, so the locks it left are free now.
        await buses.locks.take_over_predecessor(address_owner(self._sock.getsockname()[1]))
        server = QuietServer(served)
        self._server = server
        components = {
            asyncio.create_task(orchestrator.run(), name="manager-orchestrator"),
            asyncio.create_task(agents.polls.run(), name="manager-assignment-polls"),
            asyncio.create_task(server.serve(sockets=[self._sock]), name="manager-api"),
            asyncio.create_task(
                forget_on_events(
                    buses.events,
                    {
                        **dict.fromkeys(TOKEN_CHANGES, app.state.token_cache.clear),
                        **dict.fromkeys(GROUP_CHANGES, functools.partial(forget_group_options, db)),
                    },
                ),
                name=_CACHE_WATCH_TASK,
            ),
        }
        stopping = asyncio.create_task(self._stopping.wait(), name="manager-stop")
        # The socket listens already: requests queue in its backlog until the server accepts.
        logger.info("manager.ready", extra={"url": self.url})
        self.ready.set()
        crash: BaseException | None = None
        try:
            done, _ = await asyncio.wait(
                {*components, stopping}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done & components:
                crash = task.exception() if not task.cancelled() else None
                # Components wait out database and Redis outages themselves: one that ends is
                # a bug, and the manager stops rather than run on without it.
                logger.critical(
                    "manager.component_ended",
                    extra={"component": task.get_name(), "error": repr(crash)},
                    exc_info=crash,
                )
        finally:
            stopping.cancel()
            # Followed streams and long-polls end now instead of holding the shutdown.
            app.state.context.closing.set()
            agents.polls.close()
            server.should_exit = True
            await orchestrator.stop()
            for task in components:
                if task.get_name() in ("manager-assignment-polls", _CACHE_WATCH_TASK):
                    task.cancel()
            results = await asyncio.gather(*components, return_exceptions=True)
            self._sock.close()
            self.ready.clear()
        if crash is None:
            crash = next(
                (
                    r
                    for r in results
                    if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
                ),
                None,
            )
        if crash is not None:
            raise crash


def _sweep_loop(agents: AgentController, buses: Buses, config: ManagerConfig) -> DualLoop:
    """The lost-agent sweep and the started kernels' checks: a dual loop run when the last run
    said either could next have work (`AgentController.sweep`), and every long interval."""

    async def sweep() -> TaskRun:
        started = time.perf_counter()
        swept = await agents.sweep()
        return TaskRun(
            SWEEP_TASK,
            targets=len(swept.lost.agent_ids) + len(swept.checks.asked),
            changed=len(swept.lost.kernels) + len(swept.checks.failed),
            duration_ms=(time.perf_counter() - started) * 1000,
            due_in_s=swept.due_in_s,
        )

    every_s = config.timings.heartbeat_interval_s
    task = Task(SWEEP_TASK, SWEEP_HINT, sweep, lock=f"{config.prefix}:{SWEEP_TASK}")
    return DualLoop(
        task,
        buses.hints,
        buses.locks,
        short_interval_s=every_s,
        long_interval_s=max(every_s, config.intervals.long_interval_s),
    )


def _load_tls(served: uvicorn.Config, config: ManagerConfig) -> None:
    """Load the server's config now, its certificate and key with it: a bad one fails the start
    with a message naming the files, before the manager says it listens."""
    try:
        served.load()
    except OSError as exc:  # ssl.SSLError and a missing file alike
        if config.tls_cert is None:
            raise
        raise OSError(
            f"cannot serve TLS with certificate {str(config.tls_cert)!r} and key "
            f"{str(config.tls_key)!r}: {exc}; give a PEM certificate and its private key"
        ) from exc


def _server_unavailable(db: Database, error: BaseException) -> bool:
    """Whether `error` says that PostgreSQL or Redis cannot be reached (wait for it), not that
    something is wrong (fail at once). A SQLite file's errors never mean an outage."""
    # builtins' TimeoutError: Redis did not confirm the hint bus's subscription in time.
    if isinstance(error, RedisConnectionError | RedisTimeoutError | TimeoutError):
        return True
    return db.dialect == "postgresql" and database_unavailable(error)


def _bind(host: str, port: int) -> socket.socket:
    """Bind the API's socket up front, so port 0 yields a known port before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets of that protocol, and
    # without it every keep-alive response waited ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_manager(config: ManagerConfig, on_ready: Callable[[str], None] | None = None) -> None:
    """Run a manager in this thread until SIGINT/SIGTERM (the `corral manager` command)."""
    import signal

    async def main() -> None:
        daemon = ManagerDaemon(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(daemon.stop()))
        runner = await daemon.start()
        if on_ready is not None and daemon.ready.is_set():
            on_ready(daemon.url)
        with contextlib.suppress(asyncio.CancelledError):
            await runner

    asyncio.run(main())
