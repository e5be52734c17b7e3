"""The session spec: what a user asks corral to run, validated before anything is stored."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from corral.domain.bounds import (
    MAX_ARGUMENT_BYTES,
    MAX_COMMAND_ARGS,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_LENGTH,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    NAME_PATTERN,
    NAME_RULE,
    FieldValueError,
    text_problem,
    to_utc_moment,
    utf8_size,
)
from corral.domain.outcome import DEFAULT_DEPENDENCY_KIND, DependencyKind
from corral.domain.restarts import MAX_RESTART_LIMIT
from corral.domain.retry.policy import RetryPolicy
from corral.domain.session_kinds import ClusterMode as ClusterMode
from corral.domain.session_kinds import SessionType as SessionType
from corral.domain.slots import MAX_AMOUNT, ResourceSlots
from corral.domain.time_limit import MAX_TIME_LIMIT_S

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

_NAME_RE = re.compile(NAME_PATTERN.strip("^$"))
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Dependency(BaseModel):
    """A session this one waits for, and when it may start after it (Slurm's kinds); with
    `array`, `session` is a job array's id and this one waits for every element of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: uuid.UUID
    kind: DependencyKind = DEFAULT_DEPENDENCY_KIND
    array: bool = False

    @model_validator(mode="after")
    def _whole_arrays_wait_for_every_element(self) -> Dependency:
        if self.array and self.kind is DependencyKind.AFTERNOTOK:
            raise ValueError(
                "afternotok on a whole job array is not supported (it would wait for every "
                "element to fail); name the elements it should follow, like 12_3"
            )
        return self


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

    name: str | None = Field(
        default=None,
        description=f"a name to find the session by; {NAME_RULE}",
    )
    type: SessionType = Field(
        default=SessionType.BATCH,
        description="BATCH runs its command to its end; INTERACTIVE and INFERENCE run until "
        "terminated",
    )
    image: str = Field(description="the image the kernels run, like 'python'")
    # Validated even when defaulted, because a BATCH session must not fall back to no command.
    command: list[str] = Field(
        default_factory=list,
        validate_default=True,
        description="the program and its arguments, like ['python', 'train.py'] (BATCH: needed)",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description=f"environment variables of the kernels ({RESERVED_ENV_PREFIX}* is reserved)",
    )
    resources: ResourceSlots = DEFAULT_RESOURCES  # per kernel (described by its type)
    cluster_mode: ClusterMode = Field(
        default=ClusterMode.SINGLE_NODE,
        description="whether the kernels share one agent or may spread over several",
    )
    cluster_size: int = Field(
        default=1, ge=1, le=MAX_CLUSTER_SIZE, description="how many kernels the session runs"
    )
    priority: int = Field(
        default=0,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="higher runs first; past the group's max_user_priority, admins only",
    )
    resource_group: str = Field(
        default="default", description="the resource group whose agents run the session"
    )
    dependencies: list[DependencyEntry] = Field(
        default_factory=list,
        description="sessions that must end (successfully, for afterok) before this one is "
        "scheduled: session ids, or {'session': id, 'kind': 'afterany'}",
    )
    starts_at: datetime | None = Field(
        default=None, description="not scheduled before this time (null: as soon as possible)"
    )
    time_limit_s: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TIME_LIMIT_S,
        description="wall-time limit in seconds once it runs (null: the resource group's "
        "default, if any)",
    )
    workdir: str | None = Field(
        default=None,
        description="where the kernels start: a directory on the agents (the submitting one, "
        "by `corral run`); kernels start in their own directory where it does not exist",
    )
    upload: str | None = Field(
        default=None,
        description="the sha256 of a directory the owner uploaded (PUT /v1/uploads/{digest}): "
        "unpacked into each kernel's own directory, where the kernel then starts",
    )
    creation_id: str | None = Field(
        default=None,
        description="idempotency key: the same request again returns the same session; the "
        "same key with another body is a 409",
    )
    restart_limit: int = Field(
        default=0,
        ge=0,
        le=MAX_RESTART_LIMIT,
        description="how often a kernel whose process exits non-zero while running is started "
        f"again on its agent (0: never; at most {MAX_RESTART_LIMIT}); past it the kernel fails",
    )
    retry_policy: RetryPolicy | None = Field(
        default=None,
        description="retry on failure (BATCH only): the fields given win over the resource "
        "group's and the cluster's defaults",
    )

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
            raise ValueError(f"{info.field_name} {value!r} is invalid; {NAME_RULE}")
        return value

    @field_validator("image")
    @classmethod
    def _check_image(cls, value: str) -> str:
        if not value or len(value) > MAX_IMAGE_LENGTH or any(c.isspace() for c in value):
            raise ValueError(
                f"image must be 1 to {MAX_IMAGE_LENGTH} characters without whitespace, "
                f"like 'python' or 'registry.example.com/team/image:tag'"
            )
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(problem)
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
        if len(value) > MAX_COMMAND_ARGS:
            raise ValueError(
                f"a command may have at most {MAX_COMMAND_ARGS} arguments (got {len(value)}); "
                "pass long lists in a file"
            )
        total = 0
        for index, argument in enumerate(value):
            problem = text_problem(argument)
            if problem is not None:
                raise FieldValueError(str(index), problem)
            size = utf8_size(argument)
            if size > MAX_ARGUMENT_BYTES:
                raise FieldValueError(
                    str(index),
                    f"an argument may be at most {MAX_ARGUMENT_BYTES} bytes (got {size}); "
                    "pass long input in a file or an upload",
                )
            total += size
        if total > MAX_COMMAND_BYTES:
            raise ValueError(
                f"a command may be at most {MAX_COMMAND_BYTES} bytes in all (got {total}); "
                "pass long input in a file or an upload"
            )
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_VARS:
            raise ValueError(
                f"env may set at most {MAX_ENV_VARS} variables (got {len(value)}); "
                "pass the rest in a file"
            )
        total = 0
        for key, text in value.items():
            if len(key) > MAX_ENV_NAME_LENGTH or _ENV_NAME_RE.fullmatch(key) is None:
                raise ValueError(
                    f"env name {key[:64]!r} is invalid; use up to {MAX_ENV_NAME_LENGTH} letters, "
                    f"digits and '_', not starting with a digit"
                )
            if key.upper().startswith(RESERVED_ENV_PREFIX):
                raise ValueError(
                    f"env name {key!r} is reserved: corral sets {RESERVED_ENV_PREFIX}* variables "
                    f"itself; choose another name"
                )
            problem = text_problem(text)
            if problem is not None:
                raise FieldValueError(key, problem)
            size = utf8_size(text)
            if size > MAX_ENV_VALUE_BYTES:
                raise FieldValueError(
                    key, f"a value may be at most {MAX_ENV_VALUE_BYTES} bytes (got {size})"
                )
            total += len(key) + size
        if total > MAX_ENV_BYTES:
            raise ValueError(f"env may hold at most {MAX_ENV_BYTES} bytes in all (got {total})")
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
        return to_utc_moment(value)

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/") or len(value) > MAX_WORKDIR_LENGTH:
            raise ValueError(
                f"workdir must be an absolute path of at most {MAX_WORKDIR_LENGTH} characters, "
                "like /home/me/project"
            )
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(problem)
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

    @model_validator(mode="after")
    def _check_total(self) -> SessionSpec:
        # Placement adds a session's kernels up in 64-bit integers of milli-units.
        for name, amount in self.resources.items():
            if amount * self.cluster_size > MAX_AMOUNT:
                raise FieldValueError(
                    f"resources.{name}",
                    f"{self.cluster_size} kernels of {amount} make more than corral handles "
                    f"in one session; at most 1P (10¹⁵) of a slot in all",
                )
        return self
