"""`corral agent`: run an agent daemon that takes kernels from a manager."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal

import typer

from corral._logging import configure_logging
from corral._tls import CA_FILE_VARIABLE, TlsConfigError
from corral.agent.client import FAILBACK_AFTER_S, HttpManagerClient
from corral.agent.daemon import AgentConfig, AgentDaemon
from corral.agent.devices import DeviceAllocator, detect_gpus
from corral.agent.endpoints import ManagerURLError, parse_manager_urls, resolve_endpoints
from corral.agent.kernel_worker import STOP_GRACE_S, WorkerSettings
from corral.agent.runtime import Runtime
from corral.agent.runtime._run_as import RunAs, check_reachable, parse_user_map
from corral.agent.runtime.simulated import Latency, SimulationProfile
from corral.cli._common import fail, settings_from_flags
from corral.domain.slots import ResourceSlots, SlotError

RuntimeName = Literal["process", "simulated"]
PYTHON_ENVVAR = "CORRAL_AGENT_PYTHON"  # `--python` of `corral agent` and `corral up`
# `--python` of `corral agent` and `corral up`: what `python` means in jobs.
PythonOption = Annotated[
    Path | None,
    typer.Option(
        envvar=PYTHON_ENVVAR,
        help="What `python` means in jobs: an interpreter or a venv (default: the first "
        "python3 on PATH outside corral's own virtualenv).",
    ),
]


def detect_slots() -> ResourceSlots:
    """This host's cpus, memory and GPUs (`--slots auto`)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    amounts: dict[str, int | str] = {"cpu": os.cpu_count() or 1, "mem": str(memory)}
    gpus = detect_gpus()
    if gpus:
        amounts["cuda.device"] = gpus
    return ResourceSlots(amounts)


app = typer.Typer(
    help="Run an agent daemon (`corral agent --manager URL --token T`); list agents (`ls`), "
    "drain, undrain or remove one (admins).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@app.callback()
def agent_command(
    ctx: typer.Context,
    manager: Annotated[
        str | None,
        typer.Option(
            help="The manager's URL, e.g. http://10.0.0.1:8470; several, comma-separated, in "
            "order of preference (a name with several addresses stands for each): the agent "
            "fails over to the next on a connection error and returns to the first when it "
            "is back."
        ),
    ] = None,
    failback_after: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds before a failed first manager is tried again."),
    ] = FAILBACK_AFTER_S,
    token: Annotated[
        str | None,
        typer.Option(envvar="CORRAL_AGENT_TOKEN", help="The join token (or the agent's own)."),
    ] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            envvar=CA_FILE_VARIABLE,
            help="The CA certificate (PEM) an https manager's certificate is verified against "
            "(default: the system's store).",
        ),
    ] = None,
    slots: Annotated[
        str, typer.Option(help="`auto`, or e.g. cpu=8,mem=32Gi,cuda.device=2")
    ] = "auto",
    resource_group: Annotated[str, typer.Option(help="The agent's resource group.")] = "default",
    runtime: Annotated[
        str, typer.Option(help="`process` (real processes) or `simulated`.")
    ] = "process",
    data_dir: Annotated[
        Path | None, typer.Option(help="Kernels' work dirs and the agent's token file.")
    ] = None,
    agent_id: Annotated[str | None, typer.Option("--id", help="Default: the host name.")] = None,
    address: Annotated[
        str | None, typer.Option(help="How peers reach this node (default: the host name).")
    ] = None,
    image: Annotated[
        list[str] | None,
        typer.Option(help="NAME=PATH: an extra image (an interpreter or a venv). Repeatable."),
    ] = None,
    python: PythonOption = None,
    run_as: Annotated[
        str,
        typer.Option(
            help="Whose Unix user a kernel runs as: `agent` (this agent's), or `owner` (the "
            "session owner's user of the same name, or as --map-user says; needs root)."
        ),
    ] = "agent",
    map_user: Annotated[
        list[str] | None,
        typer.Option(help="CORRAL_USER=UNIX_USER for --run-as owner. Repeatable."),
    ] = None,
    allow_root_kernels: Annotated[
        bool,
        typer.Option(help="With --run-as owner: let a user mapped to root run kernels as root."),
    ] = False,
    on_shutdown: Annotated[
        str,
        typer.Option(
            help="On SIGTERM: `stop` the kernels (reported ERROR agent_shutdown), or `leave` "
            "them running; an agent started again with the same --id and --data-dir adopts "
            "them (process runtime; a kernel that ended meanwhile reports its real exit)."
        ),
    ] = "stop",
    stop_grace: Annotated[
        float, typer.Option(min=0, help="SIGTERM → SIGKILL, seconds (a second SIGTERM: now).")
    ] = STOP_GRACE_S,
    sim_preload: Annotated[
        str, typer.Option(help="Simulated: preload latency, seconds (e.g. 0.1, 0.1-0.5s, exp:0.2).")
    ] = "0",
    sim_start: Annotated[
        str, typer.Option(help="Simulated: start latency, as --sim-preload.")
    ] = "0",
    sim_run_time: Annotated[
        str, typer.Option(help="Simulated: how long a batch kernel runs, e.g. 0.5-3s.")
    ] = "0",
    sim_stop: Annotated[str, typer.Option(help="Simulated: stop latency, as --sim-preload.")] = "0",
    sim_fail_rate: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Simulated: chance a kernel fails at some stage."),
    ] = 0.0,
    sim_seed: Annotated[
        int | None, typer.Option(help="Simulated: seeds the latencies and failures.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
) -> None:
    """Run an agent until Ctrl-C / SIGTERM (with a subcommand: that subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    if not manager:
        fail("--manager is required to run an agent, e.g. --manager http://10.0.0.1:8470")
    try:
        managers = resolve_endpoints(parse_manager_urls(manager))
    except ManagerURLError as exc:
        fail(f"--manager: {exc}")
    if not token:
        fail("--token (or CORRAL_AGENT_TOKEN) is required: the manager's join token")
    if runtime not in ("process", "simulated"):
        fail(f"--runtime must be `process` or `simulated`, not {runtime!r}")
    if run_as not in ("agent", "owner"):
        fail(f"--run-as must be `agent` or `owner`, not {run_as!r}")
    if run_as == "agent" and (map_user or allow_root_kernels):
        fail("--map-user and --allow-root-kernels need --run-as owner")
    if run_as == "owner" and runtime != "process":
        fail("--run-as owner needs the process runtime (simulated kernels run no process)")
    try:
        user_map = parse_user_map(map_user or [])
    except ValueError as exc:
        fail(str(exc))
    kernels_as = RunAs(
        "owner" if run_as == "owner" else "agent", MappingProxyType(user_map), allow_root_kernels
    )
    if on_shutdown not in ("stop", "leave"):
        fail(f"--on-shutdown must be `stop` or `leave`, not {on_shutdown!r}")
    try:
        capacity = detect_slots() if slots == "auto" else ResourceSlots.parse(slots)
    except (SlotError, ValueError) as exc:
        fail(f"--slots: {exc}")
    images: dict[str, str] = {}
    for item in image or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            fail(f"--image {item!r}: expected NAME=PATH")
        images[name] = path
    latencies: dict[str, Latency] = {}
    for stage, flag, text in (
        ("preload", "--sim-preload", sim_preload),
        ("start", "--sim-start", sim_start),
        ("run", "--sim-run-time", sim_run_time),
        ("stop", "--sim-stop", sim_stop),
    ):
        try:
            latencies[stage] = Latency.parse(text)
        except ValueError as exc:
            fail(f"{flag}: {exc}")
    profile = replace(
        SimulationProfile.with_fail_rate(sim_fail_rate),
        preload=latencies["preload"],
        start=latencies["start"],
        run=latencies["run"],
        stop=latencies["stop"],
    )
    settings = settings_from_flags()
    host = socket.gethostname()
    config = AgentConfig(
        agent_id=agent_id or host,
        token=token,
        address=address or host,
        slots=capacity,
        data_dir=(data_dir or settings.data_dir / "agent").expanduser(),
        resource_group=resource_group,
        on_shutdown="leave" if on_shutdown == "leave" else "stop",
        worker=WorkerSettings(stop_grace_s=stop_grace),
    )
    configure_logging(log_level)
    if kernels_as.mode == "owner":
        try:
            check_reachable(config.data_dir)
        except ValueError as exc:
            fail(str(exc))
    chosen = _runtime(runtime, images, python, profile, sim_seed, config.data_dir, kernels_as)
    devices = DeviceAllocator(int(capacity.get("cuda.device", 0)))
    try:
        client = HttpManagerClient(managers, failback_after_s=failback_after, ca_file=ca_file)
    except TlsConfigError as exc:
        fail(f"--ca-file: {exc}")
    asyncio.run(_run(config, client, chosen, devices))


def _runtime(
    name: str,
    images: dict[str, str],
    python: Path | None,
    profile: SimulationProfile,
    seed: int | None,
    data_dir: Path,
    run_as: RunAs,
) -> Runtime:
    if name == "simulated":
        from corral.agent.runtime.sim_journal import JOURNAL_NAME, Journal, JournalEvent
        from corral.agent.runtime.simulated import SimulatedRuntime

        journal = Journal(data_dir / JOURNAL_NAME)
        journal.write(JournalEvent.BOOT, pid=os.getpid())
        return SimulatedRuntime(profile, rng=random.Random(seed), journal=journal)
    from corral.agent.runtime.process import ProcessRuntime

    try:
        return ProcessRuntime(images, python=python, run_as=run_as)
    except ValueError as exc:
        fail(str(exc))


async def _run(
    config: AgentConfig, client: HttpManagerClient, runtime: Runtime, devices: DeviceAllocator
) -> None:
    daemon = AgentDaemon(config, client, runtime, devices=devices)
    asked: list[asyncio.Future[None]] = []  # kept until the run ends

    def signalled() -> None:
        # The first signal stops the agent (its kernels by --on-shutdown, each with its grace
        # period); a second one, while it stops, kills the kernels still in theirs at once.
        asked.append(asyncio.ensure_future(daemon.kill_kernels_now() if asked else daemon.stop()))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signalled)
    await daemon.run()
