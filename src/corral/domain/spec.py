"""The session spec: what a user asks corral to run, validated before anything is stored."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from corral.domain.outcome import DEFAULT_DEPENDENCY_KIND, DependencyKind
from corral.domain.retry.policy import RetryPolicy
from corral.domain.slots import ResourceSlots
from corral.domain.time_limit import MAX_TIME_LIMIT_S


class SessionType(StrEnum):
    """What kind of work a session does."""

    BATCH = "BATCH"
    INTERACTIVE = "INTERACTIVE"
    INFERENCE = "INFERENCE"


class ClusterMode(StrEnum):
    """Whether a session's kernels share one agent or may spread over several."""

    SINGLE_NODE = "single-node"
    MULTI_NODE = "multi-node"


MAX_CLUSTER_SIZE = 256
MIN_PRIORITY = -100
MAX_PRIORITY = 100
MAX_DEPENDENCIES = 64
MAX_IMAGE_LENGTH = 256
MAX_CREATION_ID_LENGTH = 128
MAX_WORKDIR_LENGTH = 4096  # PATH_MAX on Linux
# An upload is named by the sha256 of its archive (`corral.client.uploads` packs it).
UPLOAD_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
# corral sets these in every kernel (session id, kernel rank, ...); a user may not override them.
RESERVED_ENV_PREFIX = "CORRAL_"
DEFAULT_RESOURCES = ResourceSlots({"cpu": 1, "mem": "1g"})

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_NAME_RULE = "use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Dependency(BaseModel):
    """A session this one waits for, and when it may start after it (Slurm's kinds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: uuid.UUID
    kind: DependencyKind = DEFAULT_DEPENDENCY_KIND


def _dependency_from_id(value: Any) -> Any:
    """A bare session id is an afterok dependency on that session."""
    if isinstance(value, str | uuid.UUID):
        return {"session": value}
    return value


# A list entry: a session id (afterok), or {"session": ID, "kind": "afterany"}.
DependencyEntry = Annotated[
    Dependency,
    BeforeValidator(_dependency_from_id, json_schema_input_type=uuid.UUID | Dependency),
]


class SessionSpec(BaseModel):
    """A request to run one session: its image, command, resources and scheduling hints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    type: SessionType = SessionType.BATCH
    image: str
    # Validated even when defaulted, because a BATCH session must not fall back to no command.
    command: list[str] = Field(default_factory=list, validate_default=True)
    env: dict[str, str] = Field(default_factory=dict)
    resources: ResourceSlots = DEFAULT_RESOURCES  # per kernel
    cluster_mode: ClusterMode = ClusterMode.SINGLE_NODE
    cluster_size: int = Field(default=1, ge=1, le=MAX_CLUSTER_SIZE)
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)  # higher runs first
    resource_group: str = "default"
    # Sessions that must end (successfully, for afterok) before this one may be scheduled.
    dependencies: list[DependencyEntry] = Field(default_factory=list)
    starts_at: datetime | None = None
    # Wall-time limit in seconds once it runs (None: its resource group's default, if any).
    time_limit_s: int | None = Field(default=None, ge=1, le=MAX_TIME_LIMIT_S)
    # Where the kernels start: a directory on the agents (the submitting one, by `corral run`);
    # kernels start in their own directory where it does not exist.
    workdir: str | None = None
    # The sha256 of a directory the owner uploaded (`PUT /v1/uploads/{digest}`): unpacked into
    # each kernel's own directory, where the kernel then starts (instead of `workdir`).
    upload: str | None = None
    creation_id: str | None = None  # idempotency key: a repeated request returns the same session
    # Retry on failure (BATCH only; spec document 5): the fields given here win over the
    # resource group's and the cluster's defaults.
    retry_policy: RetryPolicy | None = None

    @field_validator("retry_policy")
    @classmethod
    def _check_retry_policy(
        cls, value: RetryPolicy | None, info: ValidationInfo
    ) -> RetryPolicy | None:
        if value is not None and value.max_retries and info.data.get("type") != SessionType.BATCH:
            raise ValueError(
                "only BATCH sessions are retried automatically; drop max_retries or submit "
                "a BATCH session"
            )
        return value

    @property
    def total_resources(self) -> ResourceSlots:
        """What the whole session occupies: the per-kernel resources times the cluster size."""
        return self.resources * self.cluster_size

    @field_validator("name", "resource_group")
    @classmethod
    def _check_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and _NAME_RE.fullmatch(value) is None:
            raise ValueError(f"{info.field_name} {value!r} is invalid; {_NAME_RULE}")
        return value

    @field_validator("image")
    @classmethod
    def _check_image(cls, value: str) -> str:
        if not value or len(value) > MAX_IMAGE_LENGTH or any(c.isspace() for c in value):
            raise ValueError(
                f"image must be 1 to {MAX_IMAGE_LENGTH} characters without whitespace, "
                f"like 'python' or 'registry.example.com/team/image:tag'"
            )
        return value

    @field_validator("command")
    @classmethod
    def _check_command(cls, value: list[str], info: ValidationInfo) -> list[str]:
        # `type` is declared first, so it is in info.data unless it failed its own validation.
        if not value and info.data.get("type") == SessionType.BATCH:
            raise ValueError(
                "BATCH sessions need a command; give the program and its arguments, "
                "like ['python', 'train.py']"
            )
        if value and not value[0]:
            raise ValueError("the first element of command names the program; it must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if _ENV_NAME_RE.fullmatch(key) is None:
                raise ValueError(
                    f"env name {key!r} is invalid; use letters, digits and '_', "
                    f"not starting with a digit"
                )
            if key.upper().startswith(RESERVED_ENV_PREFIX):
                raise ValueError(
                    f"env name {key!r} is reserved: corral sets {RESERVED_ENV_PREFIX}* variables "
                    f"itself; choose another name"
                )
            if "\0" in text:
                raise ValueError(f"env value of {key!r} contains a NUL character; remove it")
        return value

    @field_validator("resources")
    @classmethod
    def _check_resources(cls, value: ResourceSlots) -> ResourceSlots:
        if value.is_zero():
            raise ValueError("resources must request at least one slot, like cpu=1,mem=1Gi")
        value.to_milli()  # raises SlotError (a ValueError) for amounts the store cannot hold
        return value

    @field_validator("dependencies")
    @classmethod
    def _check_dependencies(cls, value: list[Dependency]) -> list[Dependency]:
        if len(value) > MAX_DEPENDENCIES:
            raise ValueError(
                f"a session may depend on at most {MAX_DEPENDENCIES} sessions "
                f"(got {len(value)}); chain them through an intermediate session"
            )
        seen: set[uuid.UUID] = set()
        for dependency in value:
            if dependency.session in seen:
                raise ValueError(f"dependency {dependency.session} is listed twice; list each once")
            seen.add(dependency.session)
        return value

    @field_validator("starts_at")
    @classmethod
    def _check_starts_at(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                "starts_at must include a timezone, like 2030-01-01T09:00:00Z or +02:00"
            )
        return value.astimezone(UTC)

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/") or len(value) > MAX_WORKDIR_LENGTH or "\0" in value:
            raise ValueError(
                f"workdir must be an absolute path of at most {MAX_WORKDIR_LENGTH} characters "
                f"without NUL, like /home/me/project"
            )
        return value

    @field_validator("upload")
    @classmethod
    def _check_upload(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if UPLOAD_DIGEST_RE.fullmatch(value) is None:
            raise ValueError(
                "upload must be the sha256 of an uploaded archive: 64 lowercase hex digits"
            )
        if info.data.get("workdir") is not None:
            raise ValueError(
                "give workdir or upload, not both: an upload's kernels start where it is unpacked"
            )
        return value

    @field_validator("creation_id")
    @classmethod
    def _check_creation_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not 1 <= len(value) <= MAX_CREATION_ID_LENGTH or not value.isprintable():
            raise ValueError(
                f"creation_id must be 1 to {MAX_CREATION_ID_LENGTH} printable characters, "
                f"like a UUID the client generated"
            )
        return value
