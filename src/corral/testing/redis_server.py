"""A Redis server of a test's own (`redis-server --port N`), to kill and start again.

Fault tests never touch the machine's Redis: they start one here, point managers at it, and
kill it mid-run. Nothing is persisted (no RDB, no AOF), so a restarted server starts empty, as
a Redis that lost its memory does.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

START_DEADLINE_S = 10.0


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process on 127.0.0.1:`port`; start(), kill(), start() again."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH; install Redis to run fault tests")
        self._binary = binary
        self._workdir = workdir
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's redis:// URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> RedisServer:
        """Start the server and return once it accepts connections (fails after 10 s)."""
        if self.running:
            return self
        self._workdir.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_DEADLINE_S
        while not self._answers():
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited at start")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer in time")
            time.sleep(0.02)  # polling a process start: no event to wait on
        return self

    def kill(self) -> None:
        """SIGKILL the server and reap it (its connections drop at once)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False
