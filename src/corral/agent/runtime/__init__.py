"""Kernel runtimes: how an agent turns an assigned kernel into something that runs.

The agent daemon drives every kernel through the progress machine (`agent.progress`) and asks
its runtime to do each stage's work: `preload` (PRELOADING: resolve the image, make the work
directory), `start` (GENERATING begins), then on the returned `RunningKernel`: `wait` for it to
end, or `terminate` it, read its logs while it runs, and list its outputs after it ended. A
stage that cannot be done raises `StageFailure` with a failure cause users and retry policies
can act on; whether the daemon retries the stage is the progress machine's error limit.

A runtime whose kernels outlive their agent (`process`, under the agent's `leave` policy) offers
an `Adoption` (`Runtime.adoption`; None for runtimes that cannot adopt, like `simulated`): a
restarted agent asks it for the kernels an earlier agent left (`find_left`), takes over those
still assigned to it (`adopt`: a RunningKernel like any other) and ends the others (`discard`).
A running kernel keeps `log_marks`, how far its logs were shipped, so an adopting agent goes on
from there instead of sending the logs again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Protocol

from corral.domain.deployment import PORT_VARIABLE
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.session import MilliSlots
from corral.domain.types import KernelId, SessionId

LOG_STREAMS = ("stdout", "stderr")
# The manager believes the kernel runs on this agent, but neither the kernel nor a record of how
# it ended can be found (the agent restarted and the kernel is gone from its view).
KERNEL_LOST_CAUSE = FailureCause.KERNEL_LOST
# torch.distributed's rendezvous port is derived from the session id, so every rank of a
# session computes the same one without a round trip; the range avoids well-known and
# ephemeral ports.
MASTER_PORT_BASE = 29_500
MASTER_PORT_SPAN = 2_000
# Set in the kernels of a job array's elements (Slurm's SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID).
ARRAY_ID_VARIABLE = "CORRAL_ARRAY_ID"
ARRAY_INDEX_VARIABLE = "CORRAL_ARRAY_INDEX"


class StageFailure(Exception):
    """A runtime could not do a stage's work; `cause` is the stable failure cause."""

    def __init__(self, cause: str, message: str, *, retryable: bool = True) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause
        self.message = message
        # False: trying the same stage again cannot help (e.g. an unknown image name is not a
        # transient fault); the daemon aborts the kernel at once instead of spending retries.
        self.retryable = retryable


@record
class KernelLaunch:
    """Everything a runtime needs to prepare and start one kernel."""

    kernel_id: KernelId
    session_id: SessionId
    session_type: str
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]  # the user's variables, as submitted
    cluster_size: int
    cluster_rank: int  # this kernel's index in the session, 0 = main
    cluster_role: str
    cluster_hosts: tuple[str, ...]  # the host of every rank, in rank order
    slots: MilliSlots  # what the kernel occupies, milli-units
    work_dir: Path  # the kernel's own directory on the agent (outputs in work_dir/outputs)
    devices: tuple[int, ...] = ()  # cuda device indices assigned to this kernel
    # A job array's element: the array's number and this element's index (None: not in one).
    array_number: int | None = None
    array_index: int | None = None
    # The session's workdir: where the kernel starts when it exists on this host.
    workdir: Path | None = None
    upload: str | None = None  # the digest of the session's upload, unpacked into upload_dir
    attempt: int = 0  # the placement this launch runs (bumped each time the kernel is placed)
    owner: str = ""  # the session owner's user name (`run_as` maps it to a Unix user)
    # A serving replica's port, free on this agent when it was chosen ($CORRAL_PORT).
    port: int | None = None
    # 0: the placement's first start; n: a start after the kernel exited non-zero, its n-th
    # restart (the restart policy, `domain.restarts`). A restart continues the kernel's logs.
    restart: int = 0

    @property
    def output_dir(self) -> Path:
        """Where the kernel writes what it wants kept (CORRAL_OUTPUT_DIR)."""
        return self.work_dir / "outputs"

    @property
    def upload_dir(self) -> Path:
        """Where the session's upload is unpacked (the kernel's files stay beside it)."""
        return self.work_dir / "upload"

    @property
    def start_dir(self) -> Path:
        """Where the kernel starts if its directories exist: upload, workdir, else its own."""
        if self.upload is not None:
            return self.upload_dir
        return self.workdir or self.work_dir

    @property
    def master_port(self) -> int:
        """torch.distributed's MASTER_PORT, the same on every rank of the session."""
        digest = hashlib.sha256(str(self.session_id).encode()).digest()
        return MASTER_PORT_BASE + int.from_bytes(digest[:4], "big") % MASTER_PORT_SPAN

    def environment(self, cwd: Path) -> dict[str, str]:
        """The variables corral sets for the kernel started in `cwd` (the user's `env` under)."""
        hosts = self.cluster_hosts or ("127.0.0.1",)
        env = {
            **self.env,
            "CORRAL_SESSION_ID": str(self.session_id),
            "CORRAL_KERNEL_ID": str(self.kernel_id),
            "CORRAL_CLUSTER_SIZE": str(self.cluster_size),
            "CORRAL_CLUSTER_RANK": str(self.cluster_rank),
            "CORRAL_CLUSTER_ROLE": self.cluster_role,
            "CORRAL_CLUSTER_HOSTS": ",".join(hosts),
            "CORRAL_OUTPUT_DIR": str(self.output_dir),
            "CORRAL_WORKDIR": str(cwd),
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": str(self.master_port),
            "WORLD_SIZE": str(self.cluster_size),
            "RANK": str(self.cluster_rank),
        }
        if self.array_number is not None and self.array_index is not None:
            env[ARRAY_ID_VARIABLE] = str(self.array_number)
            env[ARRAY_INDEX_VARIABLE] = str(self.array_index)
        if self.port is not None:
            env[PORT_VARIABLE] = str(self.port)
        # Always set, so a kernel that asked for no GPU cannot see the host's GPUs.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in self.devices)
        return env


@record
class KernelExit:
    """How a kernel's process ended."""

    # The exit status; negative: killed by that signal (as subprocess reports it); None: not
    # known (a kernel that was lost, see KERNEL_LOST_CAUSE).
    exit_code: int | None
    # Set when the runtime knows why it ended badly (e.g. "oom_killed"); None otherwise. A plain
    # non-zero exit is classified by the daemon (kernel_nonzero_exit).
    failure_cause: str | None = None
    message: str = ""


@record
class LogMark:
    """How far one log stream of a kernel was shipped to the manager (byte offsets)."""

    shipped: int = 0  # every byte before this one is stored at the manager
    # An upload whose answer never came held the bytes up to here (>= shipped). The manager keeps
    # the first chunk it stored at an offset, so exactly this chunk must be sent again: a longer
    # one at the same offset would be dropped whole, and the bytes past this end with it.
    sending: int = 0


@record
class OutputFile:
    """One file a kernel left in its output directory."""

    name: str  # path relative to the output directory, '/'-separated
    size_bytes: int


class RunningKernel(Protocol):
    """A started kernel, as its runtime holds it."""

    @property
    def info(self) -> Mapping[str, Any]:
        """Runtime facts reported to the manager (host, pid, ports)."""
        ...

    async def wait(self) -> KernelExit:
        """Until the kernel ends by itself (or by `terminate`); how it ended."""
        ...

    async def terminate(self, grace_s: float) -> KernelExit:
        """Ask the whole kernel to stop, kill it after `grace_s`; how it ended. Idempotent."""
        ...

    async def read_log(self, stream: str, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of `stream` (stdout or stderr) from byte `offset` on."""
        ...

    async def list_outputs(self) -> list[OutputFile]:
        """The files in the kernel's output directory (after it ended: post-processing)."""
        ...

    async def read_output(self, name: str) -> bytes:
        """One output file's content."""
        ...

    @property
    def log_marks(self) -> Mapping[str, LogMark]:
        """How far each log stream was shipped when this kernel was handed over (empty: not)."""
        ...

    async def save_log_marks(self, marks: Mapping[str, LogMark]) -> None:
        """Remember how far the logs are shipped, for an agent that may adopt the kernel later."""
        ...

    def detach(self) -> None:
        """Stop watching the kernel and leave it running (the agent's `leave` policy)."""
        ...


class LeftKernel(Protocol):
    """A kernel an earlier agent on this host started and left behind, as its runtime found it."""

    @property
    def kernel_id(self) -> KernelId:
        """The kernel's id."""
        ...

    @property
    def devices(self) -> tuple[int, ...]:
        """The cuda devices it was given."""
        ...


class Adoption(Protocol):
    """How a runtime takes over the kernels an earlier agent left running."""

    async def find_left(self, kernels_dir: Path) -> list[LeftKernel]:
        """The kernels whose records are under `kernels_dir` (one work directory each)."""
        ...

    async def adopt(self, left: LeftKernel, launch: KernelLaunch) -> RunningKernel:
        """Take the kernel over: it runs on, or it ended (how, if known), or it was lost."""
        ...

    async def discard(self, left: LeftKernel) -> None:
        """The kernel is not this agent's: end it if it still runs, clean up, forget its record."""
        ...


class Runtime(Protocol):
    """A way of running kernels on this agent (`process`, `simulated`)."""

    @property
    def name(self) -> str:
        """The runtime's name, as agents register it."""
        ...

    @property
    def black_box(self) -> bool:
        """True when the runtime cannot report fine stages (the progress machine's black box)."""
        ...

    async def open(self) -> None:
        """The agent starts: get ready for kernels (before its first; nothing for most)."""
        ...

    async def close(self) -> None:
        """The agent stops, its kernels shut down or left: give back what `open` took."""
        ...

    async def preload(self, launch: KernelLaunch) -> None:
        """PRELOADING: resolve the image, create the work and output directories."""
        ...

    @property
    def stages(self) -> bool:
        """Whether `stage` does anything (else the agent never calls `stage` nor `unstage`)."""
        ...

    async def stage(self, launch: KernelLaunch) -> None:
        """Once prepared (and reported so): get the kernel ready to start at once, if this
        runtime can (best effort, never raises a StageFailure; `start` does what is left)."""
        ...

    async def unstage(self, launch: KernelLaunch) -> None:
        """The kernel will not be started after all: undo `stage` (nothing if it did nothing)."""
        ...

    async def start(self, launch: KernelLaunch) -> RunningKernel:
        """GENERATING begins: start the kernel and return at once."""
        ...

    @property
    def adoption(self) -> Adoption | None:
        """How a restarted agent takes over kernels left running; None: this runtime cannot."""
        ...


@record
class RuntimeNotes:
    """What a runtime says once in the agent's startup log (limits it can or cannot enforce)."""

    lines: tuple[str, ...] = field(default_factory=tuple)
