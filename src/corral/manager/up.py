"""`corral up`: a manager and one local agent in one process, on the embedded defaults.

SQLite in the data directory, in-process hints, locks and events, the API on localhost, and
a process agent with this host's cpus, memory and GPUs, joined over real HTTP with a join
token that never leaves the process. An admin user is made on first start with a token, kept
in the data directory (`admin-token`, mode 0600) and used again at every start while it is
good (not revoked, not expired; else a new one replaces it); it is printed and written to the
client config so that `corral run` works next. Stopping (Ctrl-C, SIGTERM) stops the agent
first — its kernels are stopped and reported — then the manager.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from corral._private_file import write_private
from corral.agent.client import HttpManagerClient
from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.devices import DeviceAllocator
from corral.agent.runtime.process import ProcessRuntime
from corral.api.uploads import DEFAULT_UPLOAD_MAX_BYTES
from corral.client import Client
from corral.domain.bounds import DEFAULT_MAX_REQUEST_BYTES
from corral.domain.record import record
from corral.domain.retry.policy import RetryPolicy
from corral.domain.slots import ResourceSlots
from corral.domain.tokens import DEFAULT_TOKEN_TTL_S, token_expiry
from corral.domain.types import ADMIN_ROLE, utcnow
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.proxy.server import serve_proxy
from corral.store.database import Database
from corral.store.kernel_logs import DEFAULT_LOG_CAP_BYTES
from corral.store.retention import DEFAULT_RETENTION_DAYS
from corral.store.uploads import DEFAULT_UNUSED_UPLOAD_HOURS
from corral.store.user_directory import get_user_record
from corral.store.users import create_user, issue_token, principal_for

logger = logging.getLogger(__name__)

ADMIN = "admin"
ADMIN_TOKEN_FILE = "admin-token"  # in the data directory, next to the database


@record
class UpConfig:
    """Where `corral up` keeps its state and listens."""

    data_dir: Path
    slots: ResourceSlots
    port: int = 8470
    host: str = "127.0.0.1"
    agents: int = 1  # local agents sharing the machine's slots (to try multi-node sessions)
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    retention_days: float = DEFAULT_RETENTION_DAYS
    python: Path | None = None  # what `python` means in jobs (None: the host's python3)
    upload_max_bytes: int = DEFAULT_UPLOAD_MAX_BYTES
    unused_upload_hours: float = DEFAULT_UNUSED_UPLOAD_HOURS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_kernel_slots: ResourceSlots | None = None
    retry_policy_default: RetryPolicy = field(default_factory=RetryPolicy)
    token_ttl_s: float | None = DEFAULT_TOKEN_TTL_S  # of the admin token it makes
    # The model-serving proxy's port (0: a free one; None: no proxy).
    proxy_port: int | None = 0
    # With a domain, the proxy also routes `Host: <deployment>.<domain>` (None: by path only).
    proxy_domain: str | None = None


@record
class UpReady:
    """What a user needs once corral is up."""

    url: str
    admin_token: str
    agent_ids: tuple[str, ...]
    token_file: Path
    new_token: bool  # made at this start (the kept one was missing, revoked or expired)
    proxy_url: str | None = None  # where deployments are served (None: no proxy)


async def admin_token(db: Database, kept: Path, ttl_s: float | None) -> tuple[str, bool]:
    """The admin's token kept in `kept` while it is good, else a new one saved there (the
    admin made on first start); and whether it is new."""
    now = utcnow()
    secret = await asyncio.to_thread(_read_kept, kept)
    if secret:
        holder = await principal_for(db, secret, now)
        if holder is not None and holder.role == ADMIN_ROLE:
            return secret, False
    admin = await get_user_record(db, ADMIN)
    if admin is not None and admin.role != ADMIN_ROLE:
        raise ValueError(
            f"user {ADMIN!r} of this corral is no longer an admin; make it one again "
            f"(`corral user set {ADMIN} --role admin`, or `corral admin bootstrap --data-dir "
            f"{kept.parent} --force`), or remove {kept} and the user"
        )
    user_id = admin.id if admin is not None else await create_user(db, ADMIN, ADMIN_ROLE, now)
    secret = (await issue_token(db, user_id, "corral up", now, token_expiry(now, ttl_s))).secret
    await asyncio.to_thread(write_private, kept, secret + "\n")
    return secret, True


def _read_kept(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


async def run_up(
    config: UpConfig,
    on_ready: Callable[[UpReady], None],
    stop: asyncio.Event,
    kill_now: asyncio.Event | None = None,
) -> None:
    """Run the manager and the local agent until `stop` is set or one of them fails; while
    stopping, `kill_now` set kills the kernels still in their grace period at once."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    # Before the manager starts: a wrong --python is a ValueError naming it, nothing to stop.
    runtimes = [
        ProcessRuntime(python=config.python, host=config.host) for _ in range(config.agents)
    ]
    join_token = secrets.token_urlsafe(24)
    manager = ManagerDaemon(
        ManagerConfig(
            database_url=f"sqlite:///{config.data_dir / 'corral.db'}",
            host=config.host,
            port=config.port,
            join_token=join_token,
            log_cap_bytes=config.log_cap_bytes,
            retention_days=config.retention_days,
            upload_max_bytes=config.upload_max_bytes,
            unused_upload_hours=config.unused_upload_hours,
            max_request_bytes=config.max_request_bytes,
            max_kernel_slots=config.max_kernel_slots,
            retry_policy_default=config.retry_policy_default,
        )
    )
    managing = await manager.start()
    assert manager.parts is not None
    token_file = config.data_dir / ADMIN_TOKEN_FILE
    try:
        token, new_token = await admin_token(manager.parts.db, token_file, config.token_ttl_s)
    except BaseException:
        await manager.stop()
        await asyncio.gather(managing, return_exceptions=True)
        raise
    share = split_slots(config.slots, config.agents)
    agents = [
        AgentDaemon(
            AgentConfig(
                agent_id=f"{socket.gethostname()}-local{'' if i == 0 else f'-{i}'}",
                token=join_token,
                address=config.host,
                slots=share,
                data_dir=config.data_dir / "agents" / str(i),
            ),
            HttpManagerClient(manager.url),
            runtimes[i],
            devices=DeviceAllocator(int(share.get("cuda.device", 0))),
        )
        for i in range(config.agents)
    ]
    agenting = [asyncio.create_task(a.run(), name=f"up-agent-{i}") for i, a in enumerate(agents)]
    proxy_url: str | None = None
    if config.proxy_port is not None:
        proxy_sock = _listen(config.host, config.proxy_port)
        proxy_url = f"http://{config.host}:{proxy_sock.getsockname()[1]}"
        url = manager.url
        agenting.append(
            asyncio.create_task(
                serve_proxy(proxy_sock, lambda: Client(url, token), domain=config.proxy_domain),
                name="up-proxy",
            )
        )
    registered = asyncio.gather(*(a.registered.wait() for a in agents))
    starting: set[asyncio.Future[Any]] = {*agenting, registered}
    await asyncio.wait(starting, return_when=asyncio.FIRST_COMPLETED)
    if registered.done():
        agent_ids = tuple(a.config.agent_id for a in agents)
        on_ready(UpReady(manager.url, token, agent_ids, token_file, new_token, proxy_url))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({managing, *agenting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        registered.cancel()
        for agent in agents:
            await agent.stop()
        for task in agenting:
            if task.get_name() == "up-proxy":
                task.cancel()
        killing = asyncio.create_task(_kill_when(kill_now, agents))
        agent_outcome = await asyncio.gather(*agenting, return_exceptions=True)
        killing.cancel()
        await manager.stop()
        manager_outcome = await asyncio.gather(managing, return_exceptions=True)
    for outcome in (*agent_outcome, *manager_outcome):
        if isinstance(outcome, Exception) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome


async def _kill_when(asked: asyncio.Event | None, agents: list[AgentDaemon]) -> None:
    """Once `asked` is set, every agent kills its kernels at once."""
    if asked is not None:
        await asked.wait()
        await asyncio.gather(*(agent.kill_kernels_now() for agent in agents))


def split_slots(slots: ResourceSlots, parts: int) -> ResourceSlots:
    """An equal share of `slots` for each of `parts` agents (whole cpus and devices, rounded
    down, at least one cpu each)."""
    if parts < 1:
        raise ValueError(f"agents must be at least 1, not {parts}")
    milli = slots.to_milli()
    share: dict[str, int] = {}
    for name, amount in milli.items():
        each = amount // parts
        if name in ("cpu", "cuda.device"):
            each = each // 1000 * 1000
        share[name] = max(each, 1000) if name == "cpu" else each
    return ResourceSlots.from_milli({k: v for k, v in share.items() if v})


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket for the serving proxy (port 0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"the serving proxy cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    return sock
