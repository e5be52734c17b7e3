"""Per-kernel cgroups: the cpu slot's CFS quota and the limit files each cgroup version gets."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from corral.agent.runtime import _cgroups
from corral.agent.runtime._cgroups import CPU_PERIOD_US, Cgroup, CgroupProbe, cpu_quota_us

MIB = 1 << 20


@pytest.mark.parametrize(
    ("cpu_milli", "quota_us"),
    [(1000, 100_000), (1500, 150_000), (250, 25_000), (64_000, 6_400_000), (10, 1_000)],
)
def test_cpu_quota_is_the_slot_in_hundred_microseconds(cpu_milli: int, quota_us: int) -> None:
    """A cpu slot of n milli-cpus may run n * 100 us in every 100 ms period (1.5 cpu: 150000)."""
    assert CPU_PERIOD_US == 100_000
    assert cpu_quota_us(cpu_milli) == quota_us


@pytest.mark.parametrize("cpu_milli", [1, 5, 9])
def test_cpu_quota_never_goes_below_what_the_kernel_accepts(cpu_milli: int) -> None:
    """Below 10 milli-cpus the quota stays at 1 ms per period: Linux refuses shorter ones."""
    assert cpu_quota_us(cpu_milli) == 1_000


def read(path: Path) -> str:
    """A limit file's value."""
    return path.read_text().strip()


def test_v2_cgroup_carries_both_limits(tmp_path: Path) -> None:
    """On cgroup v2 one kernel cgroup gets `cpu.max` and `memory.max` side by side."""
    parent = Cgroup(2, tmp_path, frozenset({"memory", "cpu"}))
    child = parent.create("corral-k", {"memory": 64 * MIB, "cpu": 1500})
    assert child == Cgroup(2, tmp_path / "corral-k", frozenset({"memory", "cpu"}))
    assert read(child.path / "cpu.max") == "150000 100000"
    assert read(child.path / "memory.max") == str(64 * MIB)


def test_v1_cpu_cgroup_gets_period_and_quota(tmp_path: Path) -> None:
    """In the v1 cpu hierarchy the quota goes to `cpu.cfs_quota_us`, the period beside it."""
    parent = Cgroup(1, tmp_path, frozenset({"cpu"}))
    child = parent.create("corral-k", {"memory": 64 * MIB, "cpu": 2000})
    assert child is not None
    assert child.controllers == {"cpu"}
    assert read(child.path / "cpu.cfs_quota_us") == "200000"
    assert read(child.path / "cpu.cfs_period_us") == "100000"
    assert not (child.path / "memory.limit_in_bytes").exists()


def test_a_kernel_joins_one_cgroup_per_v1_hierarchy_that_limits_it(tmp_path: Path) -> None:
    """With memory and cpu in separate v1 hierarchies a kernel gets a cgroup in each."""
    memory = Cgroup(1, tmp_path / "memory", frozenset({"memory"}))
    cpu = Cgroup(1, tmp_path / "cpu", frozenset({"cpu"}))
    for parent in (memory, cpu):
        parent.path.mkdir()
    made = CgroupProbe((memory, cpu)).create("corral-k", {"memory": 64 * MIB, "cpu": 500})
    assert [cgroup.path for cgroup in made] == [memory.path / "corral-k", cpu.path / "corral-k"]
    assert read(memory.path / "corral-k" / "memory.limit_in_bytes") == str(64 * MIB)
    assert read(cpu.path / "corral-k" / "cpu.cfs_quota_us") == "50000"


def test_a_kernel_without_a_cpu_slot_gets_no_cpu_cgroup(tmp_path: Path) -> None:
    """Only the limits a kernel has are made: no cpu slot, no cpu cgroup; no slots, none."""
    memory = Cgroup(1, tmp_path / "memory", frozenset({"memory"}))
    cpu = Cgroup(1, tmp_path / "cpu", frozenset({"cpu"}))
    for parent in (memory, cpu):
        parent.path.mkdir()
    probe = CgroupProbe((memory, cpu))
    (only,) = probe.create("corral-k", {"memory": 64 * MIB})
    assert only.path == memory.path / "corral-k"
    assert not (cpu.path / "corral-k").exists()
    assert probe.create("corral-j", {}) == ()


def test_probe_names_the_cgroup_for_each_controller() -> None:
    """`parent(controller)` is the cgroup that limits it, or None where none can be made."""
    both = Cgroup(2, Path("/sys/fs/cgroup/agent"), frozenset({"memory", "cpu"}))
    assert CgroupProbe((both,)).parent("cpu") == both
    memory_only = Cgroup(1, Path("/sys/fs/cgroup/memory/agent"), frozenset({"memory"}))
    assert CgroupProbe((memory_only,), {"cpu": "Permission denied"}).parent("cpu") is None


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("/sys/fs/cgroup", "/sys/fs/cgroup"),
        ("/mnt/my\\040cgroups", "/mnt/my cgroups"),
        ("/a\\011b\\134c", "/a\tb\\c"),
    ],
)
def test_mountinfo_paths_are_unescaped(field: str, path: str) -> None:
    """/proc/self/mountinfo writes a space as \\040 (and tab, newline, backslash likewise)."""
    assert _cgroups._unescaped(field) == path


def test_a_refused_limit_says_what_was_refused_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EINVAL from a limit file (a v1 parent with a lower quota) is named, not 'Invalid argument'
    alone, in the reason the agent's start-up note gives."""

    def refuse(self: Cgroup, name: str, limits: object) -> Cgroup:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(Cgroup, "create", refuse)
    reason = _cgroups._try(Cgroup(1, tmp_path, frozenset({"cpu"})), "cpu")
    assert reason is not None
    assert "refused a cpu limit" in reason and str(tmp_path) in reason
    assert "Invalid argument" in reason
