"""`corral simulate`'s agents: N agent daemons with the simulated runtime, in their own process.

`python -m corral.bench.agent_host FD CONFIG` is started by the simulation with one end of a
socket pair as FD and its settings as JSON. It registers every agent through the pipe
(`agent_pipe.py`), says `registered`, runs until told `stop` (or until the manager's end is
gone), stops the agents the way SIGTERM stops `corral agent`, and says `done` with the reports
its agents sent and the capacity violations its sampler saw.

The sampler checks the agents' own view every second: the kernels an agent is running never
hold more of a slot than the agent has. The manager checks its ledger alongside.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from corral._gc import tune_gc
from corral._logging import configure_logging
from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.kernel_worker import WorkerSettings
from corral.agent.runtime.simulated import SimulatedRuntime, SimulationProfile
from corral.bench.agent_pipe import PipeManagerClient
from corral.domain.slots import ResourceSlots

JOIN_TOKEN = "simulate"
AGENT_SLOTS = ResourceSlots({"cpu": 8, "mem": "32g"})
SAMPLE_EVERY_S = 1.0
MAX_REPORTED_VIOLATIONS = 20


class HostConfig(BaseModel):
    """What the agents' process runs."""

    agents: int
    fail_rate: float = 0.0
    seed: int = 0


@dataclass
class Violations:
    """Invariant violations seen so far (a few kept as examples)."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.add_seen(1, [what])

    def add_seen(self, count: int, examples: list[str]) -> None:
        """`count` violations seen elsewhere, with some of them as examples."""
        self.count += count
        self.examples += examples[: MAX_REPORTED_VIOLATIONS - len(self.examples)]


def build_agents(config: HostConfig, client: PipeManagerClient, tmp: Path) -> list[AgentDaemon]:
    """The daemons, each with its own seeded faults, data dir and address."""
    profile = (
        SimulationProfile.with_fail_rate(config.fail_rate)
        if config.fail_rate
        else SimulationProfile()
    )
    # Retries of a failed stage follow at once: simulated faults are not transient waits.
    worker = WorkerSettings(stop_grace_s=0, retry_delay_s=0, ship_logs=False)
    daemons = []
    for index in range(config.agents):
        agent_id = f"sim-{index:04d}"
        rng = random.Random(f"{config.seed}-{agent_id}")
        daemons.append(
            AgentDaemon(
                AgentConfig(
                    agent_id=agent_id,
                    token=JOIN_TOKEN,
                    address=f"10.{index // 250}.{index % 250}.1",
                    slots=AGENT_SLOTS,
                    data_dir=tmp / agent_id,
                    worker=worker,
                ),
                client,
                SimulatedRuntime(profile, rng=rng, host=agent_id),
                rng=rng,
            )
        )
    return daemons


def check_capacity(daemons: list[AgentDaemon], violations: Violations) -> None:
    """Each agent's running kernels within the agent's capacity."""
    capacity = AGENT_SLOTS.to_milli()
    for daemon in daemons:
        held: Counter[str] = Counter()
        for worker in daemon.workers.values():
            if not worker.done:
                held.update(worker.launch.slots)
        for slot, amount in held.items():
            if amount > capacity.get(slot, 0):
                violations.add(
                    f"agent {daemon.config.agent_id} runs {amount} of {slot} "
                    f"(capacity {capacity.get(slot, 0)})"
                )


async def host(sock: socket.socket, config: HostConfig) -> None:
    """Run the agents over `sock` until the manager says stop or goes away."""
    stopping = asyncio.Event()
    client = PipeManagerClient(lambda control: stopping.set() if control == "stop" else None)
    await asyncio.get_running_loop().create_unix_connection(lambda: client.connection, sock=sock)
    gone: asyncio.Future[None] = client.connection.closed
    violations = Violations()
    with tempfile.TemporaryDirectory(prefix="corral-simulate-") as tmp:
        daemons = build_agents(config, client, Path(tmp))
        running = [asyncio.create_task(d.run(), name=d.config.agent_id) for d in daemons]
        registered = asyncio.create_task(_all_registered(daemons))
        await asyncio.wait([registered, gone], return_when=asyncio.FIRST_COMPLETED)
        if registered.done():
            client.send_event("registered")
            sampler = asyncio.create_task(_sample(daemons, violations))
            told: asyncio.Future[Any] = asyncio.create_task(stopping.wait())
            await asyncio.wait([told, gone], return_when=asyncio.FIRST_COMPLETED)
            sampler.cancel()
            told.cancel()
        registered.cancel()
        for daemon in daemons:
            await daemon.stop()
        await asyncio.gather(*running, return_exceptions=True)
    client.send_event(
        "done",
        reports=sum(d.shipper.sent for d in daemons),
        violations=violations.count,
        examples=violations.examples,
    )
    client.connection.close()


async def _all_registered(daemons: list[AgentDaemon]) -> None:
    for daemon in daemons:
        await daemon.registered.wait()


async def _sample(daemons: list[AgentDaemon], violations: Violations) -> None:
    while True:
        check_capacity(daemons, violations)
        await asyncio.sleep(SAMPLE_EVERY_S)


def main(argv: list[str]) -> None:
    """`python -m corral.bench.agent_host FD CONFIG_JSON`."""
    fd, raw_config = argv
    config = HostConfig.model_validate(json.loads(raw_config))
    # As `corral simulate` logs: the failures a fault rate injects are counted, not logged.
    configure_logging("WARNING")
    logging.getLogger("corral.agent").setLevel(logging.ERROR)
    tune_gc()
    asyncio.run(host(socket.socket(fileno=int(fd)), config))


if __name__ == "__main__":
    main(sys.argv[1:])
