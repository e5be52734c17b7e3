"""Per-kernel cgroups for the `process` runtime: where they can be made, limits, removal.

A kernel's limits are keyed by controller: `memory` in bytes, `cpu` in milli-cpus (its slots'
units). On cgroup v2 one cgroup per kernel carries both; on v1 each controller has its own
hierarchy, so a kernel joins one cgroup in each hierarchy that limits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from pathlib import Path

from corral.domain.record import record

logger = logging.getLogger(__name__)

CONTROLLERS = ("memory", "cpu")
# The CFS period: a kernel may run `quota` microseconds of cpu time in every period.
CPU_PERIOD_US = 100_000
_CPU_QUOTA_MIN_US = 1_000  # the kernel refuses shorter quotas (EINVAL)
_PROBE_LIMITS = {"memory": 1 << 40, "cpu": 1_000}
_REMOVE_TIMEOUT_S = 5.0
_REMOVE_POLL_S = 0.01
_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")


def cpu_quota_us(cpu_milli: int) -> int:
    """The CFS quota per `CPU_PERIOD_US` for a cpu slot in milli-cpus (1.5 cpu: 150000)."""
    return max(_CPU_QUOTA_MIN_US, cpu_milli * CPU_PERIOD_US // 1000)


@record
class Cgroup:
    """A cgroup directory and the controllers (of CONTROLLERS) this agent limits in it."""

    version: int  # 2 (unified) or 1 (a v1 hierarchy)
    path: Path
    controllers: frozenset[str]

    def create(self, name: str, limits: Mapping[str, int] | None) -> Cgroup | None:
        """Make the child `name` with those of `limits` that apply here; None if none does.
        `limits` None: with every controller of this one, no limit written yet (a spare's)."""
        controllers = self.controllers if limits is None else self.controllers & limits.keys()
        if not controllers:
            return None
        child = Cgroup(self.version, self.path / name, controllers)
        child.path.mkdir(exist_ok=True)
        try:
            child.limit(limits or {})
        except OSError:
            child.path.rmdir()
            raise
        return child

    def renamed(self, name: str) -> Cgroup:
        """This cgroup under the name `name`, where it can be renamed (v1: a spare's cgroup gets
        its kernel's name); else itself, under its own name (v2 renames no cgroup)."""
        try:
            os.rename(self.path, self.path.with_name(name))
        except OSError:
            return self
        return Cgroup(self.version, self.path.with_name(name), self.controllers)

    def limit(self, limits: Mapping[str, int]) -> None:
        """Write those of `limits` that apply here (a spare's cgroup, limited once claimed)."""
        for controller in sorted(self.controllers & limits.keys()):
            _write_limit(self, controller, limits[controller])


@record
class CgroupProbe:
    """Where this agent can make per-kernel cgroups, and why not for the controllers it cannot."""

    parents: tuple[Cgroup, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)  # controller: why no cgroups
    # Whether a move into a cgroup goes without waiting for an RCU grace period: a cgroup2
    # hierarchy is mounted with `favordynmods` (`favors_dynamic_moves`).
    quick_moves: bool = False

    def parent(self, controller: str) -> Cgroup | None:
        """The cgroup under which kernels get `controller` limits, if any."""
        return next((p for p in self.parents if controller in p.controllers), None)

    def create(self, name: str, limits: Mapping[str, int] | None) -> tuple[Cgroup, ...]:
        """The kernel's cgroups, one per parent that applies any of `limits` (None: one per
        parent, no limit written yet: a spare's, limited once claimed)."""
        made: list[Cgroup] = []
        try:
            for parent in self.parents:
                child = parent.create(name, limits)
                if child is not None:
                    made.append(child)
        except OSError:
            for child in made:
                child.path.rmdir()  # still empty: nothing joined it yet
            raise
        return tuple(made)

    def remove_empty(self, prefix: str, stale: Callable[[str], bool]) -> None:
        """Remove the cgroups named `prefix...` under the parents whose name `stale` accepts
        (left by an agent that was killed) and that nothing is in; one in use stays (EBUSY)."""
        for parent in self.parents:
            with contextlib.suppress(OSError):
                for child in parent.path.glob(f"{prefix}*"):
                    if stale(child.name):
                        with contextlib.suppress(OSError):
                            child.rmdir()


def probe_cgroups(controllers: Iterable[str]) -> CgroupProbe:
    """Where this agent can make per-kernel cgroups for each controller (v2 first)."""
    parents: dict[Path, Cgroup] = {}
    reasons: dict[str, str] = {}
    for controller in controllers:
        try:
            candidates = _candidates(controller)
        except OSError as exc:
            reasons[controller] = f"cannot read this process's cgroups ({exc})"
            continue
        tried = []
        for candidate in candidates:
            reason = _try(candidate, controller)
            if reason is None:
                # On v2 (or co-mounted v1 controllers) one cgroup per kernel limits several.
                known = parents.get(candidate.path, candidate)
                both = known.controllers | candidate.controllers
                parents[candidate.path] = Cgroup(candidate.version, candidate.path, both)
                break
            tried.append(f"v{candidate.version} at {candidate.path}: {reason}")
        else:
            reasons[controller] = (
                "; ".join(tried) or f"no cgroup v2 or v1 {controller} hierarchy holds the agent"
            )
    quick_moves = favors_dynamic_moves(Path("/proc/self/mountinfo").read_text())
    return CgroupProbe(tuple(parents.values()), reasons, quick_moves)


def favors_dynamic_moves(mountinfo: str) -> bool:
    """Whether a cgroup2 hierarchy in `mountinfo` (/proc/self/mountinfo's text) is mounted with
    `favordynmods`.

    A process moved into a cgroup (a kernel's `sh` writing its pid into `cgroup.procs`) takes
    the kernel's cgroup threadgroup lock for writing, which waits for an RCU grace period unless
    another move came just before: 5 to 16 ms on an idle host, measured on the development
    machine (cgroup v1, Linux 6.18), against ~0.2 ms once `favordynmods` was set. The option
    (Linux 6.0 and newer) applies to every hierarchy, v1 ones included, at the cost of slightly
    dearer forks and exits.
    """
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fs) < 3 or fs[0] != "cgroup2":
            continue
        options = {*fs[2].split(","), *(fields[5].split(",") if len(fields) > 5 else ())}
        if "favordynmods" in options:
            return True
    return False


async def release_cgroups(cgroups: Iterable[Cgroup]) -> bool:
    """Kill what is left in a kernel's cgroups and remove them; whether OOM killed any member."""
    # cgroup files live in the kernel's memory: these calls never wait on a disk.
    cgroups = tuple(cgroups)
    oom_kills = 0
    for cgroup in cgroups:
        path = cgroup.path
        try:
            if (path / "cgroup.kill").exists():
                _write(path / "cgroup.kill", 1)
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)  # also those that left the process group
            if "memory" in cgroup.controllers:
                oom_kills += _oom_kills(cgroup)
        except OSError as exc:
            extra = {"path": str(path), "error": str(exc)}
            logger.warning("runtime.cgroup_read_failed", extra=extra)
    for cgroup in cgroups:
        await _remove(cgroup.path)
    return oom_kills > 0


def _oom_kills(cgroup: Cgroup) -> int:
    events = "memory.events" if cgroup.version == 2 else "memory.oom_control"
    text = (cgroup.path / events).read_text()
    counters = dict(line.split(" ", 1) for line in text.splitlines())
    # v1 before Linux 4.13 counts no OOM kills: hitting the limit is the best sign then.
    return int(counters.get("oom_kill") or (cgroup.path / "memory.failcnt").read_text())


async def _remove(path: Path) -> None:
    # Killed members leave the cgroup a moment after SIGKILL; until then rmdir says EBUSY.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _REMOVE_TIMEOUT_S
    while True:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EBUSY and loop.time() < deadline:
                await asyncio.sleep(_REMOVE_POLL_S)
                continue
            extra = {"path": str(path), "error": str(exc)}
            logger.warning("runtime.cgroup_remove_failed", extra=extra)
        return


def _write_limit(cgroup: Cgroup, controller: str, value: int) -> None:
    path, v2 = cgroup.path, cgroup.version == 2
    if controller == "memory":
        if v2:
            _write(path / "memory.max", value)
            _write(path / "memory.swap.max", 0, missing_ok=True)
            _write(path / "memory.oom.group", 1, missing_ok=True)  # one OOM ends the kernel
        else:
            _write(path / "memory.limit_in_bytes", value)
            _write(path / "memory.memsw.limit_in_bytes", value, missing_ok=True)
    elif controller == "cpu":
        quota_us = cpu_quota_us(value)
        if v2:
            _write(path / "cpu.max", f"{quota_us} {CPU_PERIOD_US}")
        else:
            _write(path / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(path / "cpu.cfs_quota_us", quota_us)
    else:
        raise ValueError(f"no cgroup limit for {controller!r}; use one of {CONTROLLERS}")


def _candidates(controller: str) -> list[Cgroup]:
    """The agent's own cgroup in each mounted hierarchy that may have `controller`, v2 first."""
    own = {}  # 2: the unified hierarchy, 1: the v1 hierarchy with the controller
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            own[2] = path
        elif controller in controllers.split(","):
            own[1] = path
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fields) < 5 or len(fs) < 3 or fs[0] not in ("cgroup", "cgroup2"):
            continue
        version = 2 if fs[0] == "cgroup2" else 1
        if version not in own or (version == 1 and controller not in fs[2].split(",")):
            continue
        # A mount may show only a subtree (containers): place our path relative to its root.
        relative = os.path.relpath(own[version], _unescaped(fields[3]))
        if not relative.startswith(".."):
            mount = Path(_unescaped(fields[4]))
            found.append(Cgroup(version, mount / relative, frozenset({controller})))
    return sorted(found, key=lambda candidate: -candidate.version)


def _try(candidate: Cgroup, controller: str) -> str | None:
    """None when a kernel cgroup can be made and limited under `candidate`, else why not."""
    path = candidate.path
    try:
        if candidate.version == 2:
            if controller not in (path / "cgroup.controllers").read_text().split():
                return f"the {controller} controller is not available to it"
            if controller not in (path / "cgroup.subtree_control").read_text().split():
                # EBUSY when the agent's own cgroup holds processes (cgroup v2 forbids both).
                _write(path / "cgroup.subtree_control", f"+{controller}")
        limits = {controller: _PROBE_LIMITS[controller]}
        probe = candidate.create(f"corral-probe-{os.getpid()}", limits)
        if probe is not None:
            os.rmdir(probe.path)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return (
                f"the kernel refused a {controller} limit under {path} ({exc.strerror}); "
                "a parent cgroup may hold it to less"
            )
        return exc.strerror or str(exc)
    return None


def _unescaped(field: str) -> str:
    """A /proc/self/mountinfo path field as the path it names (space, tab, newline and
    backslash are written there as octal escapes: `\\040`)."""
    return _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _write(path: Path, value: object, *, missing_ok: bool = False) -> None:
    try:
        path.write_text(f"{value}\n")
    except FileNotFoundError:
        if not missing_ok:
            raise
