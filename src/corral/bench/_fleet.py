"""The simulated agents of `corral simulate`: in the manager's process, or in their own.

Each agent is the real agent daemon (registration, heartbeats, long-polled assignments, the
progress machine per kernel, batched reports) with the simulated runtime. Run in the manager's
process they call its controller directly; run in separate processes (the default), all the
agents of a process share one Unix socket to the manager (`manager/stream.py`), so the manager
measured has a core of its own, as it would with agents on their own machines.

Either way the fleet checks, about every second, that no agent runs more than its capacity as
it itself sees its kernels, and says what it found when stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from corral._gc import tune_gc
from corral.agent.client import ManagerClient
from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.kernel_worker import WorkerSettings
from corral.agent.runtime.simulated import SimulatedRuntime, SimulationProfile
from corral.controller.agents import AgentController
from corral.domain.slots import ResourceSlots
from corral.manager.inprocess import InProcessManagerClient
from corral.manager.stream import AgentChannel, StreamManagerClient, serve_agents, write_frame

logger = logging.getLogger(__name__)

JOIN_TOKEN = "simulate"
AGENT_SLOTS = ResourceSlots({"cpu": 8, "mem": "32g"})
SAMPLE_EVERY_S = 1.0
MAX_EXAMPLES = 20
# How long stopped agents may take to deliver their last reports and say what they saw.
STOP_TIMEOUT_S = 60.0


class FleetFailedError(RuntimeError):
    """A process of simulated agents ended before it was told to, or did not stop in time."""


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """Which agents a fleet (or one process of it) runs, and how they fail."""

    first: int  # the index of the first agent (agents are named sim-0000, sim-0001, ...)
    count: int
    seed: int = 0
    fail_rate: float = 0.0


@dataclass
class Violations:
    """Invariant violations seen so far (the first few kept as examples)."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        """One more."""
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(what)

    def merge(self, other: Violations) -> None:
        """Another part's, added to these."""
        self.count += other.count
        self.examples.extend(other.examples[: max(0, MAX_EXAMPLES - len(self.examples))])


@dataclass
class FleetReport:
    """What a stopped fleet saw: the reports its agents delivered, capacity overruns."""

    sent: int = 0
    violations: Violations = field(default_factory=Violations)

    @classmethod
    def from_json(cls, data: Any) -> FleetReport:
        """A report a process of the fleet sent (its `asdict`)."""
        return cls(int(data["sent"]), Violations(**data["violations"]))

    def merge(self, other: FleetReport) -> None:
        """Another part's figures, added to these."""
        self.sent += other.sent
        self.violations.merge(other.violations)


class Fleet(Protocol):
    """Simulated agents attached to one manager's agent controller."""

    async def start(self) -> None:
        """Start the agents; return once every one of them has registered."""
        ...

    def check(self) -> None:
        """Raise FleetFailedError if part of the fleet has gone."""
        ...

    async def stop(self) -> FleetReport:
        """Stop every agent (each delivers its last reports); what the fleet saw."""
        ...


def build_agents(
    spec: FleetSpec, data_dir: Path, client: Callable[[], ManagerClient]
) -> list[AgentDaemon]:
    """The agent daemons of `spec`, each with its own client from `client()`."""
    profile = (
        SimulationProfile.with_fail_rate(spec.fail_rate) if spec.fail_rate else SimulationProfile()
    )
    # Retries of a failed stage follow at once: simulated faults are not transient waits.
    worker = WorkerSettings(stop_grace_s=0, retry_delay_s=0, ship_logs=False)
    daemons = []
    for index in range(spec.first, spec.first + spec.count):
        agent_id = f"sim-{index:04d}"
        rng = random.Random(f"{spec.seed}-{agent_id}")
        daemons.append(
            AgentDaemon(
                AgentConfig(
                    agent_id=agent_id,
                    token=JOIN_TOKEN,
                    address=f"10.{index // 250}.{index % 250}.1",
                    slots=AGENT_SLOTS,
                    data_dir=data_dir / agent_id,
                    worker=worker,
                ),
                client(),
                SimulatedRuntime(profile, rng=rng, host=agent_id),
                rng=rng,
            )
        )
    return daemons


def overruns(daemons: list[AgentDaemon]) -> list[str]:
    """Agents running more than their capacity, as each sees the kernels it holds."""
    capacity = AGENT_SLOTS.to_milli()
    found = []
    for daemon in daemons:
        held: Counter[str] = Counter()
        for worker in daemon.workers.values():
            if not worker.done:
                held.update(worker.launch.slots)
        for slot, amount in held.items():
            if amount > capacity.get(slot, 0):
                found.append(
                    f"agent {daemon.config.agent_id} runs {amount} of {slot} "
                    f"(capacity {capacity.get(slot, 0)})"
                )
    return found


class _Agents:
    """Daemons running in this process, sampled for overruns."""

    def __init__(self, daemons: list[AgentDaemon]) -> None:
        self.daemons = daemons
        self.report = FleetReport()
        self._tasks: list[asyncio.Task[None]] = []
        self._sampler: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(d.run(), name=f"sim-{d.config.agent_id}") for d in self.daemons
        ]

    async def registered(self) -> None:
        await asyncio.gather(*(d.registered.wait() for d in self.daemons))
        self._sampler = asyncio.create_task(self._sample())

    async def stop(self) -> FleetReport:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        for daemon in self.daemons:
            await daemon.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.report.sent = sum(d.shipper.sent for d in self.daemons)
        return self.report

    async def _sample(self) -> None:
        while True:
            for what in overruns(self.daemons):
                self.report.violations.add(what)
            await asyncio.sleep(SAMPLE_EVERY_S)


class InProcessFleet:
    """The agents in the manager's process, calling its controller directly."""

    def __init__(self, controller: AgentController, spec: FleetSpec, data_dir: Path) -> None:
        self._agents = _Agents(
            build_agents(spec, data_dir, lambda: InProcessManagerClient(controller))
        )

    async def start(self) -> None:
        """Start the agents; return once all have registered."""
        self._agents.start()
        await self._agents.registered()

    def check(self) -> None:
        """Agents in this process cannot go missing."""

    async def stop(self) -> FleetReport:
        """Stop the agents; what they saw."""
        return await self._agents.stop()


class ProcessFleet:
    """The agents in `processes` child processes, each on one Unix socket to the controller."""

    def __init__(
        self, controller: AgentController, spec: FleetSpec, data_dir: Path, processes: int
    ) -> None:
        self._controller = controller
        self._data_dir = data_dir
        per, extra = divmod(spec.count, processes)
        starts = [spec.first + i * per + min(i, extra) for i in range(processes)]
        self._parts = [
            FleetSpec(start, per + (i < extra), spec.seed, spec.fail_rate)
            for i, start in enumerate(starts)
        ]
        self._children: list[asyncio.subprocess.Process] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._serving: set[asyncio.Task[None]] = set()
        self._ready = 0
        self._all_ready = asyncio.Event()
        self._reports: list[FleetReport] = []
        self._all_reported = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Start the processes; return once every agent of them has registered."""
        socket = str(self._data_dir / "manager.sock")
        self._server = await asyncio.start_unix_server(self._serve, path=socket)
        for part in self._parts:
            self._children.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    __name__,
                    json.dumps({"socket": socket, "data_dir": str(self._data_dir), **asdict(part)}),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                )
            )
        await self._until(self._all_ready, "registered its agents")

    @property
    def pids(self) -> list[int]:
        """The processes' ids, once started."""
        return [child.pid for child in self._children]

    def check(self) -> None:
        """Raise if a process has ended before it was told to stop."""
        for child in self._children:
            if child.returncode is not None and not self._all_reported.is_set():
                raise FleetFailedError(
                    f"a process of simulated agents exited with code {child.returncode}"
                )

    async def stop(self) -> FleetReport:
        """Tell every process to stop; collect what they saw; wait for them to exit."""
        for writer in self._writers:
            if not writer.is_closing():
                write_frame(writer, [0, "stop", None])
        try:
            await asyncio.wait_for(self._until(self._all_reported, "reported"), STOP_TIMEOUT_S)
        except TimeoutError:
            raise FleetFailedError(
                f"the simulated agents did not stop within {STOP_TIMEOUT_S:.0f} s"
            ) from None
        finally:
            await self._close()
        total = FleetReport()
        for report in self._reports:
            total.merge(report)
        return total

    async def _until(self, event: asyncio.Event, what: str) -> None:
        """Wait for `event`; raise if a process ends first."""
        waiting = asyncio.create_task(event.wait())
        exits = [asyncio.create_task(child.wait()) for child in self._children]
        try:
            while not event.is_set():
                await asyncio.wait([waiting, *exits], return_when=asyncio.FIRST_COMPLETED)
                if not event.is_set():
                    for child in self._children:
                        if child.returncode is not None:
                            raise FleetFailedError(
                                f"a process of simulated agents exited with code "
                                f"{child.returncode} before it {what}"
                            )
        finally:
            for task in (waiting, *exits):
                task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        try:
            await serve_agents(self._controller, reader, writer, self._on_control)
        finally:
            writer.close()
            self._serving.discard(task)

    def _on_control(self, kind: str, body: Any) -> None:
        if kind == "ready":
            self._ready += 1
            if self._ready == len(self._parts):
                self._all_ready.set()
        elif kind == "summary":
            self._reports.append(FleetReport.from_json(body))
            if len(self._reports) == len(self._parts):
                self._all_reported.set()

    async def _close(self) -> None:
        for child in self._children:
            if child.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(child.wait(), STOP_TIMEOUT_S)
            if child.returncode is None:
                child.kill()
                await child.wait()
        if self._server is not None:
            self._server.close()
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)


async def _run_part(socket: str, data_dir: Path, spec: FleetSpec) -> int:
    """One process of the fleet: agents until told to stop; what they saw, sent back."""
    stop = asyncio.Event()

    def on_control(kind: str, _body: Any) -> None:
        if kind == "stop":
            stop.set()

    reader, writer = await asyncio.open_unix_connection(socket)
    channel = AgentChannel(reader, writer, on_control)
    agents = _Agents(build_agents(spec, data_dir, lambda: StreamManagerClient(channel)))
    agents.start()
    try:
        if not await _first(agents.registered(), channel.closed.wait()):
            return 1
        channel.control("ready", None)
        await _first(stop.wait(), channel.closed.wait())
    finally:
        report = await agents.stop()
    if channel.closed.is_set():
        return 1
    channel.control("summary", asdict(report))
    await channel.close()
    return 0


async def _first(wanted: Any, otherwise: Any) -> bool:
    """Wait for whichever ends first; True if it was `wanted`."""
    wanted_task = asyncio.ensure_future(wanted)
    other_task = asyncio.ensure_future(otherwise)
    await asyncio.wait([wanted_task, other_task], return_when=asyncio.FIRST_COMPLETED)
    other_task.cancel()
    if wanted_task.done():
        wanted_task.result()
        return True
    wanted_task.cancel()
    return False


def main(argv: list[str]) -> int:
    """`python -m corral.bench._fleet '{"socket": ..., "data_dir": ..., "first": ...}'`."""
    from corral.cli._logging import configure_logging

    options = json.loads(argv[0])
    socket, data_dir = options.pop("socket"), Path(options.pop("data_dir"))
    # As in the manager's process: the injected faults are counted, not logged one by one.
    configure_logging("WARNING")
    logging.getLogger("corral.agent").setLevel(logging.ERROR)
    tune_gc()
    return asyncio.run(_run_part(socket, data_dir, FleetSpec(**options)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = [
    "AGENT_SLOTS",
    "JOIN_TOKEN",
    "Fleet",
    "FleetFailedError",
    "FleetReport",
    "FleetSpec",
    "InProcessFleet",
    "ProcessFleet",
    "Violations",
    "build_agents",
    "overruns",
]
