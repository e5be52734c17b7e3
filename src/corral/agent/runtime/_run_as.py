"""Kernels as their owner's Unix user: which user, and how the process runtime becomes them.

An agent runs every kernel as its own Unix user unless told otherwise (`--run-as agent`, the
default, as before). With `--run-as owner` an agent running as root runs each kernel as the Unix
user named like the session's corral owner, or as `--map-user CORRAL=UNIX` says for that owner.
A user that does not exist on the host, or that is root (uid 0) unless `--allow-root-kernels`,
fails the kernel's start with a message saying which and why; nothing runs as the agent instead.

How the kernel becomes its user: `setpriv` (util-linux) is the innermost wrapper of its argv, so
everything before it (the exit-status wrapper, the cgroup and rlimit wrappers) still runs as the
agent, and the kernel itself, and all it forks, runs with the user's uid, gid and supplementary
groups, and no capabilities. The agent's own files of the kernel (its record, exit status and
logs) stay in the kernel's work directory, which stays the agent's: a kernel cannot rewrite the
record an adopting agent would act on. What the kernel writes goes to its outputs directory and
its unpacked upload, which are given to the user, or to the session's workdir.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from corral.agent.runtime import StageFailure
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record

RunAsMode = Literal["agent", "owner"]
RUN_AS_MODES: tuple[RunAsMode, ...] = ("agent", "owner")
SETPRIV = "setpriv"


@record
class UnixUser:
    """The Unix account a kernel runs as."""

    name: str
    uid: int
    gid: int
    home: str

    def variables(self) -> dict[str, str]:
        """The account's variables in the kernel's environment (the agent's would mislead)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def argv(self, setpriv: str, argv: list[str]) -> list[str]:
        """`argv` run as this user: its uid, gid and groups, no capabilities left."""
        return [
            setpriv,
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--inh-caps=-all",
            "--",
            *argv,
        ]


@record
class RunAs:
    """Whose Unix user a kernel runs as (see the module docstring)."""

    mode: RunAsMode = "agent"
    user_map: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    allow_root: bool = False

    def check(self) -> str | None:
        """The path of `setpriv` for the `owner` mode (None for `agent`); raises ValueError
        when this agent cannot run kernels so (not root, no setpriv)."""
        if self.mode == "agent":
            return None
        if os.geteuid() != 0:
            raise ValueError(
                "--run-as owner needs an agent running as root (it becomes each kernel's "
                f"user); this one runs as uid {os.geteuid()}"
            )
        setpriv = shutil.which(SETPRIV)
        if setpriv is None:
            raise ValueError(
                f"--run-as owner needs `{SETPRIV}` (util-linux) on the agent's PATH; install it"
            )
        return setpriv

    def user(self, owner: str) -> UnixUser | None:
        """The Unix user the kernel of `owner` runs as; None: the agent's own."""
        if self.mode == "agent":
            return None
        name = self.user_map.get(owner, owner)
        how = f"mapped by --map-user {owner}={name}" if owner in self.user_map else "same name"
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise StageFailure(
                FailureCause.KERNEL_START_FAILURE,
                f"this agent runs kernels as their owner's Unix user, and there is no Unix user "
                f"{name!r} ({how}) for corral user {owner!r} on this host; create it or map the "
                "user with --map-user",
                retryable=False,
            ) from None
        if entry.pw_uid == 0 and not self.allow_root:
            raise StageFailure(
                FailureCause.KERNEL_START_FAILURE,
                f"corral user {owner!r} maps to the Unix user {name!r}, which is root; this "
                "agent does not run kernels as root (--allow-root-kernels would)",
                retryable=False,
            )
        return UnixUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def check_reachable(data_dir: Path) -> None:
    """Raise ValueError unless every user can pass through to `data_dir` (the kernels' work
    directories are under it, their outputs and uploads the users' own)."""
    for folder in (data_dir, *data_dir.parents):
        if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH:
            raise ValueError(
                f"--run-as owner: kernels' users cannot pass through {folder} (mode "
                f"{stat.filemode(folder.stat().st_mode)}) to the agent's data directory "
                f"{data_dir}; give --data-dir a directory others may traverse, e.g. "
                "/var/lib/corral-agent"
            )


def parse_user_map(pairs: list[str]) -> dict[str, str]:
    """`CORRAL=UNIX` pairs (repeated `--map-user`) as a map; a malformed pair raises ValueError."""
    mapped: dict[str, str] = {}
    for pair in pairs:
        corral_name, sep, unix_name = pair.partition("=")
        if not sep or not corral_name.strip() or not unix_name.strip():
            raise ValueError(f"--map-user wants CORRAL_USER=UNIX_USER, got {pair!r}")
        mapped[corral_name.strip()] = unix_name.strip()
    return mapped


def give_to(user: UnixUser, *paths: Path) -> None:
    """Make `paths` (and, for directories, all under them) the user's; missing ones skipped."""
    for path in paths:
        if not path.exists():
            continue
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
        if path.is_dir() and not path.is_symlink():
            for folder, dirs, files in os.walk(path):
                for name in (*dirs, *files):
                    os.chown(Path(folder, name), user.uid, user.gid, follow_symlinks=False)
