"""What the API answers, as typed, immutable values (unknown fields are ignored)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from corral.domain.deployment import (
    DEFAULT_DRAIN_GRACE_S,
    Autoscaling,
    DeploymentAccess,
    HealthCheck,
)
from corral.domain.outcome import SessionResult
from corral.domain.refs import session_ref
from corral.domain.slots import ResourceSlots
from corral.domain.status import EndpointLifecycle, KernelStatus, RouteStatus, SessionStatus
from corral.domain.types import ADMIN_ROLE

T = TypeVar("T")

TERMINAL_STATUSES = frozenset(
    {SessionStatus.TERMINATED, SessionStatus.CANCELLED, SessionStatus.ERROR}
)


class ApiModel(BaseModel):
    """Base of the API's values: frozen, and tolerant of fields a newer server adds."""

    # defer_build: a model's validator is built when first used, not at import (a CLI call
    # uses one or two of them; building them all cost ~60 ms of its start).
    model_config = ConfigDict(frozen=True, extra="ignore", defer_build=True)


class Page(ApiModel, Generic[T]):
    """One page of a list; pass `next_cursor` back for the next (None: this was the last)."""

    items: tuple[T, ...]
    next_cursor: str | None = None


class Kernel(ApiModel):
    """One kernel of a session: where it runs and how it stands."""

    id: uuid.UUID
    cluster_role: str
    cluster_index: int
    agent_id: str | None = None
    status: KernelStatus
    status_info: str | None = None
    exit_code: int | None = None
    failure_cause: str | None = None
    runtime_info: dict[str, Any] | None = None
    status_changed_at: datetime | None = None
    restarts: int = 0  # restarts after a non-zero exit (the session's restart_limit)
    restarting: bool = False  # down, being started again


class SessionDependency(ApiModel):
    """A session another waits for (a whole array's elements each), and the kind (afterok,
    afterany, afternotok)."""

    session: uuid.UUID
    kind: str


class Session(ApiModel):
    """A session as the API shows it; `kernels` only when fetched one by one."""

    id: uuid.UUID
    number: int  # short, cluster-wide: what users type
    name: str | None = None
    owner: str
    type: str
    status: SessionStatus
    status_info: str | None = None
    status_changed_at: datetime
    created_at: datetime
    started_at: datetime | None = None
    terminated_at: datetime | None = None
    result: SessionResult | None = None
    failure_cause: str | None = None
    exit_code: int | None = None
    resource_group: str
    cluster_mode: str
    cluster_size: int
    priority: int = 0
    image: str
    command: tuple[str, ...] = ()
    resources: ResourceSlots  # per kernel
    creation_id: str | None = None
    # A job array's element: the array's id and number (`12`), this element's index (the
    # element is `12_7`), and how many of the array may run at once.
    array_id: uuid.UUID | None = None
    array_number: int | None = None
    array_index: int | None = None
    array_throttle: int | None = None
    workdir: str | None = None  # where its kernels start (the submitting directory)
    upload: str | None = None  # ... or the sha256 of its upload, unpacked where they start
    # Read alone: the sessions it waits for (`--after`; a whole array's elements each).
    dependencies: list[SessionDependency] | None = None
    time_limit_s: int | None = None  # wall-time limit in seconds
    deadline_at: datetime | None = None  # while RUNNING with a limit: when it is stopped
    starts_at: datetime | None = None  # not placed before (a retry's: after its delay)
    # Retry (spec document 5): the parent this session retries, its place in the chain, the
    # policy, the cause it retries, what became of its own retry; for one session read alone
    # the chain's ids oldest first and where it stands in words ("attempt 2 of 3").
    parent_session_id: uuid.UUID | None = None
    retry_count: int = 0
    max_retries: int = 0
    retry_policy: dict[str, Any] | None = None
    retry_cause: str | None = None
    retry_decision: str | None = None
    retry_chain: tuple[uuid.UUID, ...] | None = None
    retry_state: str | None = None
    # All-or-nothing admission (spec document 2): the KernelsReady condition (None while not
    # admitted), its reason and last change; evictions, the next requeue time, whether the
    # session is in the queue at all (False: deactivated; `activate` puts it back).
    kernels_ready: bool | None = None
    kernels_ready_reason: str | None = None
    kernels_ready_at: datetime | None = None
    requeue_count: int = 0
    requeue_at: datetime | None = None
    active: bool = True
    evicted_at: datetime | None = None
    eviction_reason: str | None = None
    deactivated_at: datetime | None = None
    # The restart policy: restarts allowed per kernel, and (read alone) made in all.
    restart_limit: int = 0
    restarts: int | None = None
    kernels: tuple[Kernel, ...] | None = None
    reason: str | None = None  # why a PENDING session waits, in a word (listings that ask)

    @property
    def is_terminal(self) -> bool:
        """Whether the session has ended (TERMINATED, CANCELLED or ERROR)."""
        return self.status in TERMINAL_STATUSES

    @property
    def ref(self) -> str:
        """What to type for this session: `12_7` for a job array's element, else its number."""
        return session_ref(self.number, self.array_number, self.array_index)


class TerminateResult(ApiModel):
    """What a terminate request did: `cancelled` (never ran), `terminating`, or `unchanged`."""

    id: uuid.UUID
    number: int
    outcome: str
    status: SessionStatus
    retry_chain_stopped: bool = False  # it was an attempt of a retry chain, now stopped
    chain_ended: tuple[uuid.UUID, ...] = ()  # other attempts of the chain it ended too
    message: str | None = None


class ActivateResult(ApiModel):
    """What an activate request did: `activated` (back in the queue), or `unchanged`."""

    id: uuid.UUID
    number: int
    outcome: str
    status: SessionStatus
    message: str | None = None


class Attempt(ApiModel):
    """One attempt of a retry chain: how it ended and the failure it retried."""

    id: uuid.UUID
    number: int
    attempt: int  # 1 for the first
    status: SessionStatus
    result: SessionResult | None = None
    failure_cause: str | None = None
    retry_cause: str | None = None
    exit_code: int | None = None
    created_at: datetime
    starts_at: datetime | None = None
    started_at: datetime | None = None
    terminated_at: datetime | None = None
    retry_decision: str | None = None


class Attempts(ApiModel):
    """A session's retry chain, oldest attempt first."""

    max_retries: int
    retry_state: str | None = None
    items: tuple[Attempt, ...]


class RetrySettings(ApiModel):
    """Whether an admin paused automatic retries, and the cluster's default policy."""

    paused: bool
    reason: str | None = None
    changed_at: datetime | None = None
    changed_by: str | None = None
    cluster_default: dict[str, Any]


class ArrayElement(ApiModel):
    """One element of a job array: its index and its session's id."""

    index: int
    session_id: uuid.UUID


class SessionArray(ApiModel):
    """A submitted job array: its number (what users type: `12`, elements `12_7`), its id
    (its first element's session id) and its elements."""

    id: uuid.UUID
    number: int
    count: int
    throttle: int | None = None
    elements: tuple[ArrayElement, ...] = ()


class ArrayElementState(ApiModel):
    """Where one element of a job array stands."""

    index: int
    session_id: uuid.UUID
    number: int
    status: SessionStatus
    result: SessionResult | None = None
    exit_code: int | None = None
    started_at: datetime | None = None
    terminated_at: datetime | None = None


class ArrayView(ApiModel):
    """A job array as a whole: what it runs, its elements per state, and every element."""

    id: uuid.UUID
    number: int
    name: str | None = None
    owner: str
    count: int
    throttle: int | None = None
    resource_group: str
    image: str
    command: tuple[str, ...] = ()
    resources: ResourceSlots
    created_at: datetime
    statuses: dict[str, int]
    results: dict[str, int]
    elements: tuple[ArrayElementState, ...] = ()


class ArrayTerminateResult(ApiModel):
    """What terminating a job array did, in numbers of elements."""

    id: uuid.UUID
    number: int
    outcome: str
    cancelled: int
    terminating: int
    unchanged: int


class ArrayRemoveResult(ApiModel):
    """What removing a job array did."""

    id: uuid.UUID
    number: int
    removed: int


class HistoryEntry(ApiModel):
    """One scheduling phase of a session: its outcome, attempts and last message."""

    phase: str
    from_status: str | None = None
    to_status: str | None = None
    result: str
    error_code: str | None = None
    message: str | None = None
    attempts: int = 1
    created_at: datetime
    updated_at: datetime


class Explanation(ApiModel):
    """Where a session stands in its resource group's queue and why it is (not) placed."""

    session_id: uuid.UUID
    number: int
    status: SessionStatus
    resource_group: str
    position: int | None = None  # 1-based; None when the session is not a candidate
    queue_length: int
    outcome: str  # placed / failed / waiting / blocked / not_pending / not_due
    code: str | None = None
    message: str


class Agent(ApiModel):
    """An agent node: its state, slot capacity and occupancy, and how many kernels it runs."""

    id: str
    address: str
    resource_group: str
    status: str
    schedulable: bool
    runtime: str
    labels: dict[str, str] = {}
    last_heartbeat_at: datetime | None = None
    capacity: ResourceSlots
    occupied: ResourceSlots
    kernels: int  # kernels on the agent that have not ended


class Event(ApiModel):
    """One change to one entity, e.g. kind `session.status_changed` with `{from, to, reason}`."""

    id: int | None = None
    kind: str
    entity_type: str
    entity_id: str
    payload: dict[str, Any] = {}
    created_at: datetime


class OutputFile(ApiModel):
    """One file a session's kernel left in its output directory (CORRAL_OUTPUT_DIR)."""

    kernel: int  # the kernel's cluster index (0: the main one)
    kernel_id: uuid.UUID
    name: str  # relative to the output directory, '/'-separated
    size_bytes: int


class Upload(ApiModel):
    """A directory uploaded for sessions (`upload` in a spec): its archive's digest and size."""

    digest: str
    size_bytes: int
    created_at: datetime
    sent: bool = False  # set by `Client.upload_directory`: False when the server had it already


class User(ApiModel):
    """A user: who a token belongs to, or one of the users admins list."""

    id: uuid.UUID
    name: str
    role: str
    created_at: datetime | None = None  # in listings (not in `me`)

    @property
    def is_admin(self) -> bool:
        """Whether the user sees and acts on everyone's sessions."""
        return self.role == ADMIN_ROLE


class Token(ApiModel):
    """An API token's metadata: its secret was shown once, when it was made."""

    id: uuid.UUID
    name: str
    created_at: datetime
    expires_at: datetime | None = None  # None: never expires
    last_used_at: datetime | None = None


class IssuedToken(ApiModel):
    """A token just made: `token` is its secret, shown this once and never again."""

    id: uuid.UUID
    name: str
    user: str
    token: str = Field(repr=False)
    created_at: datetime
    expires_at: datetime | None = None


class ResourceGroup(ApiModel):
    """A resource group and its options, every default filled in (the server's model)."""

    name: str
    description: str = ""
    options: dict[str, Any] = {}
    created_at: datetime


class Route(ApiModel):
    """One replica of a deployment: its session, status, address and health."""

    id: uuid.UUID
    session_id: uuid.UUID | None = None
    session_status: SessionStatus | None = None
    status: RouteStatus
    host: str | None = None
    port: int | None = None
    health_info: str | None = None
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    revision: int = 0
    probed_at: datetime | None = None
    traffic_weight: int = 100
    drain_until: datetime | None = None  # taken out: draining until its requests end or then
    status_changed_at: datetime
    created_at: datetime

    @property
    def address(self) -> str | None:
        """`host:port` once the replica runs."""
        return None if self.host is None or self.port is None else f"{self.host}:{self.port}"


class Deployment(ApiModel):
    """A deployment as the API shows it; `routes` only when fetched one by one."""

    id: uuid.UUID
    name: str
    owner: str
    lifecycle: EndpointLifecycle
    lifecycle_changed_at: datetime
    created_at: datetime
    resource_group: str
    replicas: int
    revision: int = 0
    live_replicas: int = 0
    healthy_replicas: int = 0
    image: str
    command: tuple[str, ...]
    health_check: HealthCheck
    drain_grace_s: float = DEFAULT_DRAIN_GRACE_S
    autoscaling: Autoscaling | None = None
    autoscale_wanted: int | None = None  # the autoscaler's pending recommendation
    autoscale_since: datetime | None = None
    access: DeploymentAccess = DeploymentAccess.OPEN
    routes: tuple[Route, ...] | None = None
    # Only in the answer to its creation, access by token: the token, shown that once.
    token: str | None = None


class ServingHistoryEntry(ApiModel):
    """One outcome of a deployment or route handler; repeats folded into `attempts`."""

    route_id: uuid.UUID | None = None
    phase: str
    from_status: str | None = None
    to_status: str | None = None
    result: str
    message: str = ""
    attempts: int = 1
    created_at: datetime
    updated_at: datetime


class DeploymentHistory(ApiModel):
    """A deployment's handler history and its routes'."""

    deployment: tuple[ServingHistoryEntry, ...]
    routes: tuple[ServingHistoryEntry, ...]


class ServingLoad(ApiModel):
    """Requests in flight per deployment id, summed over the live proxies."""

    proxies: int
    inflight: dict[str, int]


class RouteTableEntry(ApiModel):
    """One deployment's healthy replicas."""

    id: uuid.UUID
    name: str
    owner: str
    access: DeploymentAccess = DeploymentAccess.OPEN
    token_hash: str | None = None  # the SHA-256 of its token (access by token)
    addresses: tuple[str, ...]


class RouteTable(ApiModel):
    """The healthy route table a proxy forwards by, and its revision."""

    revision: int
    deployments: tuple[RouteTableEntry, ...]
