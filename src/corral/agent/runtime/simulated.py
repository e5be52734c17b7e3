"""The `simulated` runtime: kernels that are only a few fields, with drawn latencies and faults.

It starts no process and writes no file, so one event loop holds thousands of simulated agents
with tens of thousands of kernels (`corral simulate`, the benchmarks, the chaos tests). Every
wait goes through the injected `sleep`, so a fake clock drives it; a latency sampled as 0 skips
the await altogether. Every random decision (latencies, faults) is drawn from the one `rng` at
`preload` and `start`, never later, so a seeded run is reproducible however the tasks interleave.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Self

from corral.agent.runtime import (
    KERNEL_LOST_CAUSE,
    LOG_STREAMS,
    Adoption,
    KernelExit,
    KernelLaunch,
    LeftKernel,
    LogMark,
    OutputFile,
    RuntimeNotes,
    StageFailure,
)
from corral.agent.runtime.sim_journal import EndHow, Journal, JournalEvent, left_kernels
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.spec import SessionType
from corral.domain.types import KernelId

LatencyKind = Literal["fixed", "uniform", "exponential", "lognormal"]
# An exponential or lognormal latency without an explicit cap stops at this many times its
# mean / median, so one unlucky draw cannot stall a simulation.
DEFAULT_CAP_FACTOR = 10.0
# math.exp overflows above ~709.78; a lognormal exponent beyond this is the cap anyway.
_MAX_EXPONENT = 700.0
# The CLI's short form: each kind's parameters in order, and how many are required.
_FORMS: dict[LatencyKind, tuple[tuple[str, ...], int]] = {
    "fixed": (("value_s",), 1),
    "uniform": (("low_s", "high_s"), 2),
    "exponential": (("mean_s", "cap_s"), 1),
    "lognormal": (("median_s", "sigma", "cap_s"), 2),
}
_KIND_ALIASES: dict[str, LatencyKind] = {"exp": "exponential", **{kind: kind for kind in _FORMS}}
# Sessions of these types serve until they are told to stop; only BATCH ends by itself.
_OPEN_ENDED = frozenset({SessionType.INTERACTIVE, SessionType.INFERENCE})
# with_fail_rate's spread: each cause's share of the failure hazard (they sum to 1).
FAIL_RATE_SHARES: Mapping[str, float] = MappingProxyType(
    {
        "image_pull_failure": 0.1,
        "kernel_start_failure": 0.1,
        "kernel_nonzero_exit": 0.6,
        "oom_killed": 0.2,
    }
)
# Shared, immutable outcomes: a kernel holds a reference, never a copy.
EXITED_OK = KernelExit(0)
NONZERO_EXIT = KernelExit(1, None, "simulated: the kernel exited with code 1")
OOM_KILLED = KernelExit(-9, FailureCause.OOM_KILLED, "simulated: the kernel ran out of memory")
TERMINATED = KernelExit(-15, None, "simulated: terminated")
LOST = KernelExit(None, KERNEL_LOST_CAUSE, "simulated: the kernel died with its agent")
KILLED_AFTER_GRACE = KernelExit(-9, None, "simulated: killed after the grace period")
_NO_MARKS: Mapping[str, LogMark] = MappingProxyType({})


def _non_negative(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


@record
class Latency:
    """A distribution of delays in seconds; every sample lies in [low_s, cap_s]."""

    kind: LatencyKind
    center_s: float = 0.0  # fixed: the value; exponential: the mean; lognormal: the median
    low_s: float = 0.0  # the smallest sample (uniform: its lower bound; else 0 or the value)
    cap_s: float = 0.0  # the largest sample (uniform: its upper bound)
    sigma: float = 0.0  # lognormal: the standard deviation of the delay's logarithm

    def __post_init__(self) -> None:
        if self.kind not in _FORMS:
            raise ValueError(f"Latency.kind must be one of {list(_FORMS)}, got {self.kind!r}")
        for name in ("center_s", "low_s", "cap_s", "sigma"):
            _non_negative(f"Latency.{name}", getattr(self, name))
        if self.low_s > self.cap_s:
            raise ValueError(f"Latency.low_s ({self.low_s}) must not be above cap_s ({self.cap_s})")

    @classmethod
    def fixed(cls, value_s: float) -> Latency:
        """Always `value_s`."""
        value_s = _non_negative("value_s", value_s)
        return cls("fixed", value_s, value_s, value_s)

    @classmethod
    def uniform(cls, low_s: float, high_s: float) -> Latency:
        """Uniform between `low_s` and `high_s`."""
        low_s, high_s = _non_negative("low_s", low_s), _non_negative("high_s", high_s)
        if low_s > high_s:
            raise ValueError(f"low_s ({low_s}) must not be above high_s ({high_s})")
        return cls("uniform", (low_s + high_s) / 2, low_s, high_s)

    @classmethod
    def exponential(cls, mean_s: float, cap_s: float | None = None) -> Latency:
        """Exponential with `mean_s`, cut at `cap_s` (default: DEFAULT_CAP_FACTOR x the mean)."""
        mean_s = _non_negative("mean_s", mean_s)
        cap_s = mean_s * DEFAULT_CAP_FACTOR if cap_s is None else _non_negative("cap_s", cap_s)
        return cls("exponential", mean_s, 0.0, cap_s)

    @classmethod
    def lognormal(cls, median_s: float, sigma: float, cap_s: float | None = None) -> Latency:
        """Lognormal with `median_s` and log-deviation `sigma`, cut at `cap_s` (as exponential)."""
        median_s, sigma = _non_negative("median_s", median_s), _non_negative("sigma", sigma)
        cap_s = median_s * DEFAULT_CAP_FACTOR if cap_s is None else _non_negative("cap_s", cap_s)
        return cls("lognormal", median_s, 0.0, cap_s, sigma)

    @classmethod
    def parse(cls, text: str) -> Latency:
        """From the CLI: "0.01", "2s", "0.5-3s" (uniform), "uniform:0.5:3", "exp:0.005", ..."""
        head, *rest = text.strip().split(":")
        try:
            if not rest:
                # Seconds may carry an "s"; "LOW-HIGH" is the uniform distribution between.
                seconds = head.strip().removesuffix("s")
                low, dash, high = seconds.partition("-")
                if dash and low.strip():  # not a negative number's sign
                    return cls.uniform(_number("low_s", low), _number("high_s", high))
                return cls.fixed(_number("value_s", seconds))
            kind = _KIND_ALIASES.get(head.strip().lower())
            if kind is None:
                raise ValueError(
                    f"unknown distribution {head!r}; expected one of {', '.join(_KIND_ALIASES)}"
                )
            names, required = _FORMS[kind]
            if not required <= len(rest) <= len(names):
                usage = ":".join((head, *names[:required])) + "".join(
                    f"[:{name}]" for name in names[required:]
                )
                raise ValueError(f"expected {usage}, got {len(rest)} number(s)")
            values = [_number(name, part) for name, part in zip(names, rest, strict=False)]
            factory: Callable[..., Latency] = getattr(cls, kind)
            return factory(*values)
        except ValueError as exc:
            raise ValueError(f"invalid latency {text!r}: {exc}") from None

    def sample(self, rng: random.Random) -> float:
        """One delay in seconds, never below low_s (>= 0) nor above cap_s."""
        kind = self.kind
        if kind == "fixed":
            return self.center_s
        if kind == "uniform":
            value = self.low_s + (self.cap_s - self.low_s) * rng.random()
        elif kind == "exponential":
            # 1 - random() is in (0, 1], so the logarithm is finite.
            value = -self.center_s * math.log(1.0 - rng.random())
        else:
            if self.center_s == 0.0:
                return self.low_s
            exponent = self.sigma * rng.gauss(0.0, 1.0)
            value = self.cap_s if exponent > _MAX_EXPONENT else self.center_s * math.exp(exponent)
        return min(max(value, self.low_s), self.cap_s)

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.center_s:g}"
        if self.kind == "uniform":
            return f"uniform:{self.low_s:g}:{self.cap_s:g}"
        if self.kind == "exponential":
            return f"exp:{self.center_s:g}:{self.cap_s:g}"
        return f"lognormal:{self.center_s:g}:{self.sigma:g}:{self.cap_s:g}"


def _number(name: str, part: str) -> float:
    try:
        return float(part)
    except ValueError:
        raise ValueError(f"{name} {part!r} is not a number") from None


ZERO_LATENCY = Latency.fixed(0.0)


@record
class SimulationProfile:
    """How simulated kernels behave: each stage's latency and each failure cause's probability."""

    preload: Latency = ZERO_LATENCY
    start: Latency = ZERO_LATENCY
    # How long a BATCH kernel runs before it exits by itself (INTERACTIVE / INFERENCE: forever).
    run: Latency = ZERO_LATENCY
    stop: Latency = ZERO_LATENCY  # how long a terminate takes (above grace_s: killed at grace_s)
    image_pull_failure: float = 0.0  # per preload call; retryable
    kernel_start_failure: float = 0.0  # per start call; not retryable
    kernel_nonzero_exit: float = 0.0  # per run: exits with code 1
    oom_killed: float = 0.0  # per run: killed with -9, failure_cause "oom_killed"

    def __post_init__(self) -> None:
        for name in FAIL_RATE_SHARES:
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:  # also rejects NaN
                raise ValueError(
                    f"SimulationProfile.{name} must be a probability in [0, 1], got {p!r}"
                )
        # One run ends one way: the two run outcomes are exclusive, so their sum is a probability.
        if self.kernel_nonzero_exit + self.oom_killed > 1.0 + 1e-12:
            raise ValueError(
                "SimulationProfile.kernel_nonzero_exit + oom_killed must not exceed 1 "
                f"(one run ends one way), got {self.kernel_nonzero_exit} + {self.oom_killed}"
            )

    @classmethod
    def with_fail_rate(cls, fail_rate: float) -> SimulationProfile:
        """Zero latencies and a chance `fail_rate` that a kernel fails at some stage.

        Each cause gets its FAIL_RATE_SHARES share w of the hazard: its stage survives with
        probability (1 - fail_rate) ** w, so the product over the stages (preload, start, run) is
        exactly 1 - fail_rate; for a small rate a cause's probability is about w x fail_rate.
        The rate counts one attempt per stage: a preload the daemon retries draws again. Set
        latencies with `dataclasses.replace`.
        """
        if not 0.0 <= fail_rate <= 1.0:
            raise ValueError(f"fail_rate must be a probability in [0, 1], got {fail_rate!r}")
        survive = 1.0 - fail_rate
        shares = FAIL_RATE_SHARES
        run_share = shares["kernel_nonzero_exit"] + shares["oom_killed"]
        run_fails = 1.0 - survive**run_share
        return cls(
            image_pull_failure=1.0 - survive ** shares["image_pull_failure"],
            kernel_start_failure=1.0 - survive ** shares["kernel_start_failure"],
            kernel_nonzero_exit=run_fails * shares["kernel_nonzero_exit"] / run_share,
            oom_killed=run_fails * shares["oom_killed"] / run_share,
        )

    def describe(self) -> str:
        """One line: the latencies (seconds) and the failure probabilities."""
        faults = ", ".join(f"{name} {getattr(self, name):.4g}" for name in FAIL_RATE_SHARES)
        return (
            f"latencies (s): preload {self.preload}, start {self.start}, run {self.run}, "
            f"stop {self.stop}; failure probabilities: {faults}"
        )


FAST_PROFILE = SimulationProfile()  # for benchmarks: no latency, no fault


class SimulatedKernel:
    """A simulated kernel: a few fields, plus one task while a positive run latency elapses."""

    __slots__ = ("_ended", "_exit", "_launch", "_runtime", "_stopping", "_timer")

    def __init__(
        self,
        runtime: SimulatedRuntime,
        launch: KernelLaunch,
        run_s: float | None,  # None: runs until terminated
        outcome: KernelExit,
    ) -> None:
        self._runtime = runtime
        self._launch = launch
        self._exit: KernelExit | None = None
        self._ended: asyncio.Future[KernelExit] | None = None
        self._stopping = False
        self._timer: asyncio.Task[None] | None = None
        if run_s == 0.0:
            self._exit = outcome
            runtime._journal_end(launch.kernel_id, EndHow.EXITED, outcome)
        elif run_s is not None:
            self._timer = asyncio.get_running_loop().create_task(self._run_out(run_s, outcome))

    @classmethod
    def ended(cls, runtime: SimulatedRuntime, launch: KernelLaunch, how: KernelExit) -> Self:
        """A kernel an earlier agent started, already ended `how` (lost: it died with it)."""
        kernel = cls(runtime, launch, None, how)
        kernel._exit = how
        return kernel

    @property
    def info(self) -> Mapping[str, Any]:
        """The simulated host (and which restart of the kernel this is, after the first)."""
        if self._launch.restart:
            return {**self._runtime._info, "restart": self._launch.restart}
        return self._runtime._info

    async def wait(self) -> KernelExit:
        """Until the run latency elapsed or `terminate` ended the kernel; how it ended."""
        if self._exit is not None:
            return self._exit
        if self._ended is None:
            self._ended = asyncio.get_running_loop().create_future()
        # Shielded: a cancelled waiter must not cancel the outcome other waiters share.
        return await asyncio.shield(self._ended)

    async def terminate(self, grace_s: float) -> KernelExit:
        """End the kernel after the stop latency (killed at `grace_s` if that is shorter)."""
        if self._exit is None and not self._stopping:
            self._stopping = True
            outcome = TERMINATED
            try:
                stop_s = self._runtime._profile.stop.sample(self._runtime._rng)
                if stop_s > grace_s:
                    stop_s, outcome = max(grace_s, 0.0), KILLED_AFTER_GRACE
                if stop_s > 0:
                    await self._runtime._sleep(stop_s)
            finally:
                # The signal was sent: even if our caller is cancelled, the kernel ends. If it
                # ended by itself meanwhile, that outcome stands (_finish keeps the first).
                self._finish(outcome, EndHow.TERMINATED)
        return await self.wait()

    async def read_log(self, stream: str, offset: int, limit: int) -> bytes:
        """A deterministic banner on stdout, the exit line once ended, the failure on stderr."""
        if stream not in LOG_STREAMS:
            raise ValueError(f"unknown log stream {stream!r}; expected one of {LOG_STREAMS}")
        if offset < 0 or limit < 0:
            raise ValueError(f"offset and limit must be >= 0, got {offset} and {limit}")
        return self._log(stream)[offset : offset + limit]

    async def list_outputs(self) -> list[OutputFile]:
        """Always empty: a simulated kernel writes nothing."""
        return []

    async def read_output(self, name: str) -> bytes:
        """Always FileNotFoundError: a simulated kernel writes nothing."""
        raise FileNotFoundError(f"simulated kernel {self._launch.kernel_id} has no output {name!r}")

    @property
    def log_marks(self) -> Mapping[str, LogMark]:
        """Always empty: a simulated kernel is never handed over to another agent."""
        return _NO_MARKS

    async def save_log_marks(self, marks: Mapping[str, LogMark]) -> None:
        """Nothing to keep: no later agent can adopt a simulated kernel."""

    def detach(self) -> None:
        """Nothing to let go of: a simulated kernel left behind lives on only in memory."""

    def _log(self, stream: str) -> bytes:
        launch, ended = self._launch, self._exit
        if stream == "stderr":
            return f"{ended.message}\n".encode() if ended is not None and ended.exit_code else b""
        text = f"simulated kernel {launch.kernel_id} rank {launch.cluster_rank}/"
        text += f"{launch.cluster_size}\n"
        if ended is not None:
            text += f"simulated kernel {launch.kernel_id} exited with code {ended.exit_code}\n"
        return text.encode()

    async def _run_out(self, run_s: float, outcome: KernelExit) -> None:
        await self._runtime._sleep(run_s)
        self._timer = None  # done: _finish must not cancel the task it runs in
        self._finish(outcome, EndHow.EXITED)

    def _finish(self, outcome: KernelExit, how: EndHow) -> None:
        if self._exit is not None:
            return
        self._exit = outcome
        self._runtime._journal_end(self._launch.kernel_id, how, outcome)
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(outcome)


class SimulatedRuntime:
    """The `simulated` runtime: no process, latencies and faults drawn from a profile."""

    def __init__(
        self,
        profile: SimulationProfile = FAST_PROFILE,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        host: str = "sim",
        journal: Journal | None = None,
    ) -> None:
        self._profile = profile
        self._journal = journal  # the agent's record of started and ended kernels, if any
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        # One mapping for all of this runtime's kernels, read-only so none can alter it.
        self._info: Mapping[str, Any] = MappingProxyType({"host": host})

    @property
    def name(self) -> str:
        """Always "simulated"."""
        return "simulated"

    @property
    def black_box(self) -> bool:
        """False: every stage is reported."""
        return False

    @property
    def adoption(self) -> Adoption | None:
        """With a journal, the kernels an earlier agent started and never ended: each died with
        that agent, and is adopted as lost (never started again). Without one, None."""
        return None if self._journal is None else JournalAdoption(self, self._journal)

    def notes(self) -> RuntimeNotes:
        """One line describing the profile."""
        return RuntimeNotes((f"simulated runtime, no processes; {self._profile.describe()}",))

    async def open(self) -> None:
        """Nothing to get ready."""

    async def close(self) -> None:
        """Nothing to give back."""

    async def preload(self, launch: KernelLaunch) -> None:
        """Wait the preload latency; maybe fail with image_pull_failure (retryable)."""
        if await self._stage_fails(self._profile.preload, self._profile.image_pull_failure):
            raise StageFailure(
                FailureCause.IMAGE_PULL_FAILURE, f"simulated: cannot pull {launch.image!r}"
            )

    @property
    def stages(self) -> bool:
        """False: a simulated start's latency is drawn at start; nothing to get ready."""
        return False

    async def stage(self, launch: KernelLaunch) -> None:
        """Never called (`stages` is False)."""

    async def unstage(self, launch: KernelLaunch) -> None:
        """Never called (`stages` is False)."""

    async def start(self, launch: KernelLaunch) -> SimulatedKernel:
        """Wait the start latency; maybe fail with kernel_start_failure (not retryable)."""
        profile, rng = self._profile, self._rng
        if await self._stage_fails(profile.start, profile.kernel_start_failure):
            raise StageFailure(
                FailureCause.KERNEL_START_FAILURE,
                "simulated: the kernel did not start",
                retryable=False,
            )
        if self._journal is not None:
            self._journal.write(
                JournalEvent.START,
                kernel=str(launch.kernel_id),
                attempt=launch.attempt,
                restart=launch.restart,
                session=str(launch.session_id),
                slots=dict(launch.slots),
            )
        if launch.session_type in _OPEN_ENDED:
            return SimulatedKernel(self, launch, None, EXITED_OK)
        run_s = profile.run.sample(rng)
        outcome = EXITED_OK
        if profile.kernel_nonzero_exit or profile.oom_killed:
            draw = rng.random()
            if draw < profile.kernel_nonzero_exit:
                outcome = NONZERO_EXIT
            elif draw < profile.kernel_nonzero_exit + profile.oom_killed:
                outcome = OOM_KILLED
        return SimulatedKernel(self, launch, run_s, outcome)

    def _journal_end(self, kernel_id: KernelId, how: EndHow, outcome: KernelExit) -> None:
        if self._journal is not None:
            self._journal.write(
                JournalEvent.END,
                kernel=str(kernel_id),
                how=how.value,
                exit_code=outcome.exit_code,
                failure_cause=outcome.failure_cause,
            )

    def _journal_forgotten(self, kernel_id: KernelId) -> None:
        if self._journal is not None:
            self._journal.write(JournalEvent.FORGOTTEN, kernel=str(kernel_id))

    async def _stage_fails(self, latency: Latency, failure_p: float) -> bool:
        delay_s = latency.sample(self._rng)
        if delay_s > 0:
            await self._sleep(delay_s)
        # A zero probability draws nothing: the common fault-free case stays cheap.
        return bool(failure_p) and self._rng.random() < failure_p


@record
class LeftSimulatedKernel:
    """A kernel the journal shows an earlier agent started, and no agent has discarded."""

    kernel_id: KernelId
    attempt: int  # the placement it started under
    ended: KernelExit | None  # how it ended, if it did before its agent died
    restart: int = 0  # which start of the kernel (`KernelLaunch.restart`)
    devices: tuple[int, ...] = ()  # a simulated kernel holds no real device


class JournalAdoption:
    """Adoption for the simulated runtime, from its journal. Nothing of a simulated kernel
    outlives its agent: a kernel found running died with it and is adopted as lost (the
    manager hears `kernel_lost`; its end is journaled so); one found ended is adopted with its
    exit. An adopted kernel stays in the record, as the process runtime's records do, so an
    agent killed again before the manager heard its end finds it once more; a discarded one
    (the manager no longer assigns it) is journaled forgotten and never found again."""

    def __init__(self, runtime: SimulatedRuntime, journal: Journal) -> None:
        self._runtime = runtime
        self._journal = journal

    async def find_left(self, kernels_dir: Path) -> list[LeftKernel]:
        """The journal's kernels started and not yet discarded (`kernels_dir` is not used)."""
        return [
            LeftSimulatedKernel(
                KernelId(uuid.UUID(kernel)),
                entry.attempt,
                None if entry.ended is None else _exit_of(entry.ended),
                restart=entry.restart,
            )
            for kernel, entry in left_kernels(self._journal.path).items()
        ]

    async def adopt(self, left: LeftKernel, launch: KernelLaunch) -> SimulatedKernel:
        """The kernel as it ended: with its exit, or lost with its agent."""
        found = _as_left(left)
        launch = dataclasses.replace(launch, restart=found.restart)
        return SimulatedKernel.ended(self._runtime, launch, self._ended(found))

    async def discard(self, left: LeftKernel) -> None:
        """Not this agent's any more: journaled forgotten, so no later agent finds it."""
        found = _as_left(left)
        self._ended(found)
        self._runtime._journal_forgotten(found.kernel_id)

    def _ended(self, left: LeftSimulatedKernel) -> KernelExit:
        """How the kernel ended; one found running is journaled lost first."""
        if left.ended is not None:
            return left.ended
        self._runtime._journal_end(left.kernel_id, EndHow.LOST, LOST)
        return LOST


def _exit_of(end: Mapping[str, Any]) -> KernelExit:
    code, cause = end.get("exit_code"), end.get("failure_cause")
    return KernelExit(
        None if code is None else int(code),
        None if cause is None else str(cause),
        "simulated: ended before its agent died",
    )


def _as_left(left: LeftKernel) -> LeftSimulatedKernel:
    if not isinstance(left, LeftSimulatedKernel):
        raise TypeError(f"{left!r} was not found by the simulated runtime; adopt its own finds")
    return left
