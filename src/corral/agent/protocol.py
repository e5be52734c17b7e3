"""The agent protocol's messages, as both ends put them on the wire (JSON over HTTP).

Agents pull: they register, heartbeat, long-poll their assignment and post reports, log chunks
and outputs; the manager never calls an agent. Bytes (logs, outputs) travel base64-encoded.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
)

from corral.domain.bounds import (
    MAX_LABEL_KEY_LENGTH,
    MAX_LABEL_VALUE_LENGTH,
    MAX_LABELS,
    MAX_RUNTIME_INFO_BYTES,
    NAME_PATTERN,
    Text,
    check_json_text,
)
from corral.domain.restarts import MAX_RESTART_LIMIT
from corral.domain.session import KernelIntent
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus

AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
MAX_BATCH = 10_000  # reports, chunks or outputs in one request
MAX_CHUNK_BYTES = 1 << 20  # one log chunk, decoded
# The columns' ranges: a value past them would fail the write (a 500) instead of a 422.
MAX_OFFSET = 2**63 - 1  # BIGINT
EXIT_CODE_MIN, EXIT_CODE_MAX = -(2**31), 2**31 - 1  # INTEGER


def _check_runtime_info(value: dict[str, Any]) -> dict[str, Any]:
    check_json_text(value)
    size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_RUNTIME_INFO_BYTES:
        raise ValueError(f"runtime_info may be at most {MAX_RUNTIME_INFO_BYTES} bytes as JSON")
    return value


# What a runtime says about a kernel it runs (host, pid, cgroups): free-form, bounded.
RuntimeInfo = Annotated[dict[str, Any], AfterValidator(_check_runtime_info)]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegisterRequest(_Message):
    """An agent joining (with the join token) or coming back (with its own token)."""

    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    address: Text = Field(min_length=1, max_length=256)  # where the agent's kernels are reached
    resource_group: str = Field(default="default", pattern=NAME_PATTERN)
    slots: ResourceSlots  # capacity, e.g. {"cpu": 8, "mem": "32g"}
    labels: dict[
        Annotated[Text, Field(min_length=1, max_length=MAX_LABEL_KEY_LENGTH)],
        Annotated[Text, Field(max_length=MAX_LABEL_VALUE_LENGTH)],
    ] = Field(default_factory=dict, max_length=MAX_LABELS)
    runtime: Text = Field(default="process", max_length=32)

    @field_validator("slots")
    @classmethod
    def _check_slots(cls, value: ResourceSlots) -> ResourceSlots:
        if value.is_zero():
            raise ValueError("an agent must offer at least one slot, e.g. cpu=4")
        return value


class RegisterResponse(_Message):
    """Who the agent is now and how often the manager expects to hear from it."""

    agent_id: str
    token: str | None  # a new agent token, shown once; None when the agent presented its own
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    assignment_wait_s: float


class HeartbeatResponse(_Message):
    """The agent's status as the manager sees it (LOST: register again)."""

    status: str


class AssignedKernelMessage(_Message):
    """One kernel an agent is responsible for, with what the manager wants of it."""

    id: uuid.UUID
    session_id: uuid.UUID
    cluster_role: str
    cluster_index: int
    cluster_size: int
    cluster_hosts: list[str]
    status: KernelStatus
    desired_state: KernelIntent | None
    desired_generation: int
    stage_failure: str | None
    attempt: int = 0  # the placement (bumped by each): the agent's reports name it
    # The kernel's restarts so far (the session's `restart_limit` bounds them), and whether
    # the manager knows one under way (`domain.restarts`).
    restarts: int = 0
    restarting: bool = False
    # The manager has heard nothing of this started kernel for a while: the agent answers with
    # what it knows (its status, its end, or that it does not know it).
    asked: bool = False
    # Not the users' JSON form of slots: the agent applies limits from the store's integers.
    slots: dict[str, int] = Field(
        description="what the kernel occupies, in milli-units (1 cpu = 1000, 1 byte = 1000)"
    )
    spec: dict[str, Any]
    # A job array's element: the array's number (`12`, what users type) and this element's
    # index (CORRAL_ARRAY_ID, CORRAL_ARRAY_INDEX).
    array_number: int | None = None
    array_index: int | None = None
    # The session owner's user name: an agent running kernels as their owners' Unix users maps it.
    owner: str = ""


class AssignmentMessage(_Message):
    """The agent's full desired state at `revision`."""

    agent_id: str
    revision: int
    kernels: list[AssignedKernelMessage]


class KernelReportMessage(_Message):
    """One kernel's progress (see store.kernel_reports.KernelReport)."""

    kernel_id: uuid.UUID
    status: KernelStatus
    # Strict: a report is answered per kernel (200 even when each is refused), so a mistyped
    # field must fail the request itself rather than be coerced (`false` is not exit code 0).
    exit_code: StrictInt | None = Field(default=None, ge=EXIT_CODE_MIN, le=EXIT_CODE_MAX)
    failure_cause: Text | None = Field(default=None, max_length=64)
    message: Text | None = Field(default=None, max_length=4096)
    runtime_info: RuntimeInfo | None = None
    stage_failed: StrictBool = False
    # The placement the report is about, as the assignment named it (None: the current one).
    attempt: StrictInt | None = Field(default=None, ge=0)
    # With status RUNNING: the kernel's `restarts`-th restart, under way (`restarting`: its
    # process exited, it is started again) or done (it runs again); `domain.restarts`.
    restarts: StrictInt | None = Field(default=None, ge=1, le=MAX_RESTART_LIMIT)
    restarting: StrictBool = False


class ReportBatch(_Message):
    """Reports in the order they happened."""

    reports: list[KernelReportMessage] = Field(max_length=MAX_BATCH)


class ReportAccepted(_Message):
    """Per report: applied, acknowledged as applied before, or refused (per kernel, why).

    Every report not refused is acknowledged: the agent need not send it again.
    """

    applied: int
    already: int = 0
    refused: dict[str, str] = Field(default_factory=dict)


class LogChunkMessage(_Message):
    """Bytes of a kernel's stream from `offset` on."""

    kernel_id: uuid.UUID
    stream: Literal["stdout", "stderr"]
    offset: int = Field(ge=0, le=MAX_OFFSET)
    data: str  # base64

    @field_validator("data")
    @classmethod
    def _check_data(cls, value: str) -> str:
        if len(decode_bytes(value)) > MAX_CHUNK_BYTES:
            raise ValueError(f"a log chunk may hold at most {MAX_CHUNK_BYTES} bytes")
        return value

    def raw(self) -> bytes:
        """The chunk's bytes."""
        return decode_bytes(self.data)


class LogBatch(_Message):
    """Log chunks of any kernels of the agent."""

    chunks: list[LogChunkMessage] = Field(max_length=MAX_BATCH)


class OutputMessage(_Message):
    """One output file of a kernel."""

    kernel_id: uuid.UUID
    name: Text = Field(min_length=1, max_length=512)
    data: str  # base64

    @field_validator("data")
    @classmethod
    def _check_data(cls, value: str) -> str:
        decode_bytes(value)  # a ValueError here is a 422 naming the field, not a 500 later
        return value

    def raw(self) -> bytes:
        """The file's bytes."""
        return decode_bytes(self.data)


class OutputBatch(_Message):
    """Output files of any kernels of the agent."""

    outputs: list[OutputMessage] = Field(max_length=MAX_BATCH)


def encode_bytes(data: bytes) -> str:
    """Bytes as the protocol carries them."""
    return base64.b64encode(data).decode("ascii")


def decode_bytes(text: str) -> bytes:
    """The bytes a protocol field carries; a clear error when it is not base64."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ValueError("data must be base64-encoded bytes") from exc
