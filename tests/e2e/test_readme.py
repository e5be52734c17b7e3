"""The README's commands, run as a new user would: they must keep working as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.e2e._up import start_up

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def sh_commands() -> list[str]:
    """Every command line of the README's ```sh blocks, in order (```text blocks are prose)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def make_target(name: str) -> list[str]:
    """The recipe lines of a Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{name}:.*\n((?:\t.*\n)+)", text, flags=re.MULTILINE)
    assert match, f"the Makefile has no `{name}` target"
    return [line.strip() for line in match.group(1).splitlines()]


def test_the_readme_commands_run(tmp_path: Path) -> None:
    """`make run` brings corral up, the `corral run` line prints hello, `make test` exists."""
    commands = sh_commands()
    assert commands[0] == "make run" and "make test" in commands
    assert make_target("run")[-1] == "$(BIN)/corral up"
    assert any("pytest" in line for line in make_target("test"))
    # `make run` is `corral up` once installed: run that (on a free port) and the rest against it.
    for up in start_up(tmp_path):
        for command in commands[1:]:
            if command == "make test":
                continue  # this suite itself
            argv = shlex.split(command.replace(".venv/bin/", f"{BIN}/"))
            done = subprocess.run(
                argv, capture_output=True, text=True, env=up.env, timeout=90, check=False
            )
            assert done.returncode == 0, f"{command}\n{done.stderr}"
            if "print('hello')" in command:
                assert done.stdout == "hello\n"
