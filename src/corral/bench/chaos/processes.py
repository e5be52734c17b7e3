"""Process supervision for `corral chaos`: real `corral manager` and `corral agent` processes.

Each runs in its own process group with its output in a log file; the harness kills and starts
them again by id, and `Fleet.close` stops every one it started, whatever happened meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this
READY_DEADLINE_S = 60.0


@dataclass
class Supervised:
    """One `python -m corral ...` process: start, kill, start again; its log in `log`."""

    name: str
    args: Sequence[str]
    log: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start it (appending to its log)."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "corral", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                # Its own group: a Ctrl-C at the terminal reaches the harness alone, which then
                # stops everything in order.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL and reap it."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, SIGKILL after STOP_GRACE_S."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, chars: int = 2000) -> str:
        """The end of its log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Manager(Supervised):
    """A manager on a fixed port, so agents' URL lists stay valid across restarts."""

    port: int = 0

    @property
    def url(self) -> str:
        """Its API's base URL."""
        return f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> None:
        """Until /healthz answers; RuntimeError if the process ends or the deadline passes."""
        end = time.monotonic() + deadline_s
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                if not self.running:
                    raise RuntimeError(f"{self.name} exited at start:\n{self.tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{self.url}/healthz")).status_code == 200:
                        return
                if time.monotonic() > end:
                    raise RuntimeError(f"{self.name} did not answer in time:\n{self.tail()}")
                await _pause()


def _die_with_parent() -> None:
    """In the child: be SIGKILLed when the harness dies, even if it is SIGKILLed itself."""
    # Linux only; elsewhere the harness's own clean-up is all there is.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def _pause() -> None:
    await asyncio.sleep(0.1)  # polling a process start: no event to wait on


@dataclass
class Fleet:
    """Every process the run started."""

    managers: list[Manager] = field(default_factory=list)
    agents: list[Supervised] = field(default_factory=list)

    def close(self) -> None:
        """Stop every process: agents first (they would only retry), then managers."""
        for agent in self.agents:
            agent.kill()
        for manager in self.managers:
            manager.stop()

    def restart_exited(self) -> list[tuple[str, int | None]]:
        """Start again each process that ended by itself; their names and exit codes.

        The fault injectors kill and start a process with no await between, so a process found
        ended here ended on its own.
        """
        ended = []
        for process in (*self.managers, *self.agents):
            if process.process is not None and not process.running:
                ended.append((process.name, process.process.returncode))
                process.start()
        return ended
