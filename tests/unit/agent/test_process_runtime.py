"""ProcessRuntime's startup notes: which memory and cpu limits this host lets it enforce, and
whether a kernel's move into its cgroups waits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from corral.agent.runtime import process as process_runtime
from corral.agent.runtime._cgroups import Cgroup, CgroupProbe, favors_dynamic_moves
from corral.agent.runtime.process import ProcessRuntime

V1_MEMORY = Cgroup(1, Path("/sys/fs/cgroup/memory/agent"), frozenset({"memory"}))
V1_CPU = Cgroup(1, Path("/sys/fs/cgroup/cpu/agent"), frozenset({"cpu"}))
V2_BOTH = Cgroup(2, Path("/sys/fs/cgroup/agent"), frozenset({"memory", "cpu"}))
NO_CPU = "v1 at /sys/fs/cgroup/cpu/agent: Permission denied"


def fake_probe(
    monkeypatch: pytest.MonkeyPatch, result: CgroupProbe
) -> Callable[[], list[tuple[str, ...]]]:
    """Make the runtime find `result` instead of this host's cgroups; the controllers asked."""
    asked: list[tuple[str, ...]] = []

    def probe(controllers: Iterable[str]) -> CgroupProbe:
        asked.append(tuple(controllers))
        return result

    monkeypatch.setattr(process_runtime, "probe_cgroups", probe)
    return lambda: asked


def test_cpu_limits_through_v1_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the v1 cpu hierarchy writable, the notes name it beside the memory one."""
    fake_probe(monkeypatch, CgroupProbe((V1_MEMORY, V1_CPU)))
    runtime = ProcessRuntime()
    assert (runtime.memory_limit_mode, runtime.cpu_limit_mode) == ("cgroup", "cgroup")
    assert runtime.notes().lines[:2] == (
        "memory limits: cgroup v1 under /sys/fs/cgroup/memory/agent",
        "cpu limits: cgroup v1 under /sys/fs/cgroup/cpu/agent (a CFS quota from the cpu slot)",
    )


def test_cpu_limits_through_a_v2_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """On cgroup v2 both limits are in the same cgroup, and the notes say so for each."""
    fake_probe(monkeypatch, CgroupProbe((V2_BOTH,)))
    assert ProcessRuntime().notes().lines[:2] == (
        "memory limits: cgroup v2 under /sys/fs/cgroup/agent",
        "cpu limits: cgroup v2 under /sys/fs/cgroup/agent (a CFS quota from the cpu slot)",
    )


def test_without_cpu_cgroups_the_note_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no cpu cgroup can be made, cpu is not enforced and the note gives the reason."""
    fake_probe(monkeypatch, CgroupProbe((V1_MEMORY,), {"cpu": NO_CPU}))
    runtime = ProcessRuntime()
    assert (runtime.memory_limit_mode, runtime.cpu_limit_mode) == ("cgroup", "none")
    assert runtime.notes().lines[:2] == (
        "memory limits: cgroup v1 under /sys/fs/cgroup/memory/agent",
        f"cpu limits: not enforced (kernels share the host's cores); cgroups: {NO_CPU}",
    )


def test_without_any_cgroups_both_notes_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without cgroups memory falls back to RLIMIT_AS and cpu is not enforced, each with why."""
    fake_probe(monkeypatch, CgroupProbe((), {"memory": "no memory", "cpu": "no cpu"}))
    runtime = ProcessRuntime()
    assert (runtime.memory_limit_mode, runtime.cpu_limit_mode) == ("rlimit", "none")
    assert runtime.notes().lines[:2] == (
        "memory limits: best effort (RLIMIT_AS, not for kernels holding GPUs); cgroups: no memory",
        "cpu limits: not enforced (kernels share the host's cores); cgroups: no cpu",
    )


def test_memory_limits_off_still_probes_for_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """memory_limits=False asks for cpu cgroups only, and cpu limits stay enforced."""
    asked = fake_probe(monkeypatch, CgroupProbe((V1_CPU,)))
    runtime = ProcessRuntime(memory_limits=False)
    assert asked() == [("cpu",)]
    assert (runtime.memory_limit_mode, runtime.cpu_limit_mode) == ("off", "cgroup")
    assert runtime.notes().lines[1].startswith("cpu limits: cgroup v1 under /sys/fs/cgroup/cpu")


# /proc/self/mountinfo lines as this development machine shows them (cgroup v1 controllers,
# an empty cgroup2 hierarchy), with and without `favordynmods`.
V1_LINE = "35 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
V2_LINE = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw"
V2_FAVORING = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,favordynmods"


def test_moves_are_quick_only_with_a_cgroup2_mounted_favoring_dynamic_moves() -> None:
    assert favors_dynamic_moves(f"{V1_LINE}\n{V2_FAVORING}\n")
    assert not favors_dynamic_moves(f"{V1_LINE}\n{V2_LINE}\n")
    assert not favors_dynamic_moves(V1_LINE.replace("rw,memory", "rw,memory,favordynmods"))
    assert not favors_dynamic_moves("")


_WAITS = "cgroup moves: a kernel's move into its cgroups may wait for an RCU grace period "
_AVOIDED = "mounting cgroup2 with favordynmods (Linux 6.0 or newer) avoids it"


@pytest.mark.parametrize(
    ("quick", "spare", "said"),
    [
        (True, None, "cgroup moves: quick (a cgroup2 hierarchy is mounted with favordynmods)"),
        (
            False,
            None,
            f"{_WAITS}(5-16 ms on an idle host); a spare kernel process waits in cgroups of its "
            f"own to take that wait off a lone kernel's start; {_AVOIDED}",
        ),
        (False, False, f"{_WAITS}(5-16 ms on an idle host); {_AVOIDED}"),
    ],
)
def test_the_notes_say_whether_a_move_into_a_cgroup_waits(
    monkeypatch: pytest.MonkeyPatch, quick: bool, spare: bool | None, said: str
) -> None:
    """Where kernels get cgroups, the startup log says whether joining them costs a start an
    RCU grace period, whether a spare takes it off a start (by default where it does), and how
    to avoid it; the python line stays last."""
    fake_probe(monkeypatch, CgroupProbe((V1_MEMORY, V1_CPU), quick_moves=quick))
    lines = ProcessRuntime(spare=spare).notes().lines
    assert lines[2] == said
    assert lines[-1].startswith("python: ")


def test_without_cgroups_the_notes_say_nothing_of_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_probe(monkeypatch, CgroupProbe((), {"memory": "no memory", "cpu": "no cpu"}))
    assert not any(line.startswith("cgroup moves") for line in ProcessRuntime().notes().lines)
