"""The deployment spec: a model served by N replicas, each an INFERENCE session, health-checked.

Validated like the session spec: the replica's image, command, env, resources and resource group
are checked by the session spec itself (`replica_spec`), so one rule has one definition.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.domain.bounds import NAME_PATTERN, NAME_RULE, FieldValueError
from corral.domain.slots import ResourceSlots
from corral.domain.spec import DEFAULT_RESOURCES, SessionSpec, SessionType

MAX_REPLICAS = 64
MAX_HEALTH_PATH_LENGTH = 256
# Set in every replica's environment: the port the agent chose for it to listen on.
PORT_VARIABLE = "CORRAL_PORT"
# Events of deployments and routes: entity types and the kinds of their status changes.
DEPLOYMENT_ENTITY = "deployment"
ROUTE_ENTITY = "route"
DEPLOYMENT_CHANGED = "deployment.lifecycle_changed"
ROUTE_CHANGED = "route.status_changed"
DEPLOYMENT_ROLLED_BACK = "deployment.rolled_back"  # an update's new version never served
# The route table's change events: one entity, so that a proxy follows them alone.
ROUTE_TABLE_ENTITY = "serving"
ROUTE_TABLE_ID = "route-table"
ROUTE_TABLE_CHANGED = "serving.route_table_changed"
# The autoscaler changed a deployment's replica count.
DEPLOYMENT_AUTOSCALED = "deployment.autoscaled"
# A replica taken out (scale down, rolling update) drains this long at most by default: the
# grace period of a Kubernetes pod's termination.
DEFAULT_DRAIN_GRACE_S = 30.0
MAX_DRAIN_GRACE_S = 3600.0
# A proxy looks at its requests in flight this often and reports them when they (or its route
# table) changed, else at least every PROXY_REPORT_KEEPALIVE_S; a report older than
# PROXY_REPORT_TTL_S is a proxy gone (stopped, or cut off): its counts no longer count.
PROXY_REPORT_INTERVAL_S = 1.0
PROXY_REPORT_KEEPALIVE_S = 2.0
PROXY_REPORT_TTL_S = 5.0

# A deployment token starts so: a leaked one is easy to recognise (a user's API token is `crl_`).
DEPLOYMENT_TOKEN_PREFIX = "crld_"


class DeploymentAccess(StrEnum):
    """Who the proxy lets through to a deployment's replicas."""

    OPEN = "open"  # anyone who reaches the proxy
    TOKEN = "token"  # requests carrying the deployment's token (`Authorization: Bearer ...`)


# Token by default: the proxy is one address for every user's deployments, and a deployment is
# as private as its owner's sessions until its owner opens it (a hosted endpoint's choice, not
# Ray Serve's, which serves one trusted team).
DEFAULT_ACCESS = DeploymentAccess.TOKEN

_NAME_RE = re.compile(NAME_PATTERN.strip("^$"))


class HealthCheck(BaseModel):
    """How the manager probes a replica over HTTP; the defaults are a Kubernetes readiness
    probe's (period 10 s, timeout 1 s, no initial delay, 3 failures, 1 success)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(default="/health", description="the path probed with GET")
    interval_s: float = Field(default=10.0, gt=0, le=3600, description="seconds between probes")
    timeout_s: float = Field(default=1.0, gt=0, le=600, description="a probe's time limit (s)")
    initial_delay_s: float = Field(
        default=0.0, ge=0, le=3600, description="seconds after the replica starts before probing"
    )
    failure_threshold: int = Field(
        default=3, ge=1, le=100, description="failed probes in a row that make it UNHEALTHY"
    )
    success_threshold: int = Field(
        default=1, ge=1, le=100, description="passed probes in a row that make it HEALTHY"
    )
    expected_status: int = Field(
        default=200, ge=100, le=599, description="the HTTP status a healthy replica answers"
    )

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if (
            not value.startswith("/")
            or len(value) > MAX_HEALTH_PATH_LENGTH
            or any(c.isspace() or not c.isprintable() for c in value)
        ):
            raise ValueError(
                f"path must start with '/' and be at most {MAX_HEALTH_PATH_LENGTH} printable "
                "characters without whitespace, like '/health'"
            )
        return value


class Autoscaling(BaseModel):
    """Autoscaling by requests in flight, measured at the proxies: the replica count follows
    ceil(in flight / target_inflight) within [min_replicas, max_replicas], once the
    recommendation has held for the delay of its direction. The delays' defaults are Ray
    Serve's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS, description="fewest replicas")
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="most replicas")
    target_inflight: float = Field(
        default=2.0, gt=0, le=10_000, description="requests in flight per replica to aim at"
    )
    upscale_delay_s: float = Field(
        default=30.0, ge=0, le=86_400, description="how long more replicas must be wanted"
    )
    downscale_delay_s: float = Field(
        default=600.0, ge=0, le=86_400, description="how long fewer replicas must be wanted"
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.max_replicas < self.min_replicas:
            raise FieldValueError(
                "max_replicas",
                f"must be min_replicas ({self.min_replicas}) or more (got {self.max_replicas})",
            )
        return self

    def bounded(self, replicas: int) -> int:
        """`replicas` within the bounds."""
        return max(self.min_replicas, min(self.max_replicas, replicas))


class DeploymentSpec(BaseModel):
    """A request to serve a model: N replicas of one command behind one name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description=f"unique among the owner's deployments; {NAME_RULE}")
    image: str = Field(description="the image the replicas run, like 'python'")
    command: list[str] = Field(
        description="the server and its arguments; it listens on $CORRAL_PORT"
    )
    env: dict[str, str] = Field(default_factory=dict, description="the replicas' environment")
    resources: ResourceSlots = DEFAULT_RESOURCES  # per replica
    resource_group: str = Field(default="default", description="where the replicas run")
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS, description="how many replicas")
    health_check: HealthCheck = Field(default_factory=HealthCheck)
    max_unavailable: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description="during a rolling update, how many fewer healthy replicas than `replicas` "
        "may serve",
    )
    drain_grace_s: float = Field(
        default=DEFAULT_DRAIN_GRACE_S,
        ge=0,
        le=MAX_DRAIN_GRACE_S,
        description="a replica taken out gets no new requests and ends when its requests in "
        "flight have, or this many seconds later at the latest",
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="scale by requests in flight within bounds (none: `replicas` stays as set)",
    )
    access: DeploymentAccess = Field(
        default=DEFAULT_ACCESS,
        description="'token': the proxy asks for the deployment's token (shown once at create, "
        "rotatable); 'open': anyone who reaches the proxy",
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if _NAME_RE.fullmatch(value) is None:
            raise ValueError(f"name {value!r} is invalid; {NAME_RULE}")
        return value

    @field_validator("command")
    @classmethod
    def _check_command(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("a deployment needs a command: the server, like ['python', 'app.py']")
        return value

    @model_validator(mode="after")
    def _check_replicas_in_bounds(self) -> Self:
        policy = self.autoscaling
        if policy is not None and policy.bounded(self.replicas) != self.replicas:
            raise FieldValueError(
                "replicas",
                f"must be within autoscaling's min_replicas and max_replicas "
                f"({policy.min_replicas}..{policy.max_replicas}; got {self.replicas})",
            )
        return self

    def replica_spec(self, creation_id: str | None = None) -> SessionSpec:
        """The INFERENCE session of one replica; raises pydantic's ValidationError naming the
        field (image, command, env, resources, resource_group) that the session spec refuses."""
        return SessionSpec(
            type=SessionType.INFERENCE,
            image=self.image,
            command=self.command,
            env=self.env,
            resources=self.resources,
            resource_group=self.resource_group,
            creation_id=creation_id,
        )


class DeploymentUpdate(BaseModel):
    """A rolling update: what changes in the replicas' spec (fields left out stay)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = None
    command: list[str] | None = None
    env: dict[str, str] | None = None
    max_unavailable: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    drain_grace_s: float | None = Field(default=None, ge=0, le=MAX_DRAIN_GRACE_S)
    autoscaling: Autoscaling | None = Field(
        default=None, description="a new policy; an explicit null turns autoscaling off"
    )

    def applied_to(self, spec: DeploymentSpec) -> DeploymentSpec:
        """`spec` with this update's fields (validated again)."""
        changes = self.model_dump(exclude_none=True)
        merged = spec.model_dump() | changes
        if self.autoscaling is not None:  # the replica count follows the new bounds
            merged["replicas"] = self.autoscaling.bounded(spec.replicas)
        elif "autoscaling" in self.model_fields_set:  # null: off, the count stays as it is
            merged["autoscaling"] = None
        return DeploymentSpec.model_validate(merged)


class DeploymentScale(BaseModel):
    """A new replica count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(ge=0, le=MAX_REPLICAS, description="how many replicas to run")
