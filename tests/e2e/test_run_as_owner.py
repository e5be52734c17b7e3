"""Kernels as their owner's Unix user (issue 33): an agent running as root with `--run-as owner`
runs each kernel as the Unix user named like its corral owner (or as `--map-user` says), refuses
root and users it does not know, and keeps its own files of the kernel out of the user's reach.
The Unix users are real, made by the test with useradd and removed after."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.domain.status import SessionStatus
from corral.domain.types import KernelId
from corral.store.log_reading import read_log
from corral.store.output_files import read_output_file
from tests.e2e._cluster import live_cluster

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("useradd") and shutil.which("setpriv")),
    reason="needs root, useradd and setpriv (util-linux) to make users and become them",
)

# What the kernel tells of itself; then whether it could touch the agent's files of it.
_WHO = (
    'echo "user=$(id -un) uid=$(id -u) home=$HOME"; '
    'echo mine > "$CORRAL_OUTPUT_DIR/made-by-kernel" && echo output=written; '
    "if (echo forged > .corral-kernel.json) 2>/dev/null; then echo record=writable; "
    "else echo record=protected; fi"
)


@pytest.fixture
def unix_user() -> Iterator[str]:
    """A new Unix user with no home directory and no login shell."""
    name = f"crl{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


async def test_kernels_run_as_their_owners_unix_user(
    database_url: str, tmp_path: Path, unix_user: str
) -> None:
    """Same name → that user (uid, HOME, the outputs it writes are its own, the agent's record
    of the kernel out of its reach); a corral user mapped to root, or with no Unix user, fails
    with a message saying so, and nothing runs as the agent instead."""
    for folder in (tmp_path, *tmp_path.parents):  # pytest's are root's alone (0700)
        folder.chmod(folder.stat().st_mode | stat.S_IXOTH)
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent(
            "node-a", "cpu=4,mem=4g", "--run-as", "owner", "--map-user", "boss=root"
        )
        await cluster.wait_agents_alive({"node-a"})
        same_name = await cluster.add_user(unix_user)
        boss = await cluster.add_user("boss")
        stranger = await cluster.add_user(f"nobody-{uuid.uuid4().hex[:6]}")
        resources = {"cpu": 1, "mem": "256m"}

        sid = await cluster.submit_as(same_name, image="shell", command=[_WHO], resources=resources)
        row = await cluster.wait_status(sid)
        assert (row["status"], row["result"]) == (SessionStatus.TERMINATED, "success"), row
        (kernel,) = await cluster.kernels(sid)
        stdout = (await read_log(cluster.db, KernelId(kernel["id"]), "stdout")).decode()
        entry = pwd.getpwnam(unix_user)
        assert f"user={unix_user} uid={entry.pw_uid} home={entry.pw_dir}\n" in stdout
        assert "record=protected" in stdout
        assert "output=written" in stdout  # its outputs directory is the user's
        # ... and what the user wrote there was shipped (read back as the user's own file)
        shipped = await read_output_file(cluster.db, KernelId(kernel["id"]), "made-by-kernel")
        assert shipped == b"mine\n"

        for owner, message in (
            (boss, "which is root"),
            (stranger, "there is no Unix user"),
        ):
            sid = await cluster.submit_as(owner, image="shell", command=[_WHO], resources=resources)
            row = await cluster.wait_status(sid)
            assert (row["status"], row["failure_cause"]) == (
                SessionStatus.ERROR,
                "kernel_start_failure",
            ), row
            (kernel,) = await cluster.kernels(sid)
            assert message in (kernel["status_info"] or ""), kernel
            assert await read_log(cluster.db, KernelId(kernel["id"]), "stdout") == b""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--map-user", "boss=root"], "--map-user and --allow-root-kernels need --run-as owner"),
        (["--run-as", "owner", "--map-user", "boss"], "--map-user wants CORRAL_USER=UNIX_USER"),
        (["--run-as", "someone"], "--run-as must be `agent` or `owner`"),
        (["--run-as", "owner", "--runtime", "simulated"], "needs the process runtime"),
        (["--run-as", "owner"], "kernels' users cannot pass through"),
    ],
)
def test_the_agent_refuses_run_as_flags_it_cannot_honour(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    """`corral agent` says what is wrong with its --run-as flags and exits 2, before it reaches
    for a manager; a data directory other users cannot traverse (pytest's tmp is 0700) is one."""
    done = subprocess.run(
        [
            sys.executable, "-m", "corral", "agent", "--manager", "http://127.0.0.1:9",
            "--token", "t", "--slots", "cpu=1,mem=1g", "--data-dir", str(tmp_path / "agent"),
            *flags,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
