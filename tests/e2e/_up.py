"""`corral up` as a user runs it: a background process with a clean HOME, for e2e tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.e2e._cli import corral


class Up:
    """A `corral up` process and the environment of a user on the same machine."""

    def __init__(
        self, process: subprocess.Popen[str], env: dict[str, str], said: list[str] | None = None
    ) -> None:
        self.process = process
        self.env = env
        self.said = said or []  # what it printed until it was up

    def said_after(self, prefix: str) -> str:
        """The rest of the first line it printed starting with `prefix` (up to a space or
        comma): `said_after("admin token: ")` is the admin's token."""
        line = next(line for line in self.said if line.startswith(prefix))
        return line[len(prefix) :].split()[0].rstrip(",")

    def corral(self, *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
        return corral(*args, env=self.env, timeout_s=timeout_s)


def _home_env(tmp_path: Path) -> dict[str, str]:
    """A user with nothing configured: HOME, config and data all under tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        HOME=str(tmp_path / "home"),
        XDG_CONFIG_HOME=str(tmp_path / "home" / ".config"),
        XDG_DATA_HOME=str(tmp_path / "home" / ".local" / "share"),
        CORRAL_CONFIG=str(tmp_path / "none.toml"),
    )
    return env


def start_up(tmp_path: Path, *args: str) -> Iterator[Up]:
    env = _home_env(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "corral", "up", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("client config written to"):
            break
    else:
        raise AssertionError(
            f"corral up ended ({process.wait()}) before it was up:\n{''.join(seen)}"
        )
    assert any(line.startswith("admin token: crl_") for line in seen), seen
    try:
        yield Up(process, env, seen)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=60) == 0
        finally:
            process.stdout.close()
