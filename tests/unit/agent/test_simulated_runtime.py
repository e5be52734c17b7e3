"""The simulated runtime: latency distributions, fault probabilities, terminate, logs."""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.agent.runtime import KERNEL_LOST_CAUSE, KernelExit, KernelLaunch, Runtime, StageFailure
from corral.agent.runtime.sim_journal import Journal, read_journal
from corral.agent.runtime.simulated import (
    FAIL_RATE_SHARES,
    OOM_KILLED,
    Latency,
    SimulatedRuntime,
    SimulationProfile,
)
from corral.domain.spec import SessionType
from corral.domain.types import KernelId, SessionId

KERNEL_ID = KernelId(uuid.UUID(int=1))


class RecordingSleep:
    """An injected sleep: records each delay, then returns at once (or never, if `block`)."""

    def __init__(self, *, block: bool = False) -> None:
        self.delays: list[float] = []
        self.block = block

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        if self.block:
            await asyncio.get_running_loop().create_future()
        else:
            await asyncio.sleep(0)


def launch(session_type: str = SessionType.BATCH, rank: int = 0, size: int = 1) -> KernelLaunch:
    return KernelLaunch(
        kernel_id=KERNEL_ID,
        session_id=SessionId(uuid.UUID(int=2)),
        session_type=session_type,
        image="python",
        command=("true",),
        env={},
        cluster_size=size,
        cluster_rank=rank,
        cluster_role="main",
        cluster_hosts=("sim",) * size,
        slots={},
        work_dir=Path("/nonexistent"),
    )


async def run_one(runtime: SimulatedRuntime) -> str:
    """A kernel through preload, start and its run: "ok" or the cause it failed with."""
    try:
        await runtime.preload(launch())
        kernel = await runtime.start(launch())
    except StageFailure as failure:
        return failure.cause
    ended = await kernel.wait()
    if ended.exit_code == 0:
        return "ok"
    return ended.failure_cause or "kernel_nonzero_exit"


seconds = st.floats(min_value=0, max_value=1e300, allow_nan=False, allow_infinity=False)
latencies = st.one_of(
    st.builds(Latency.fixed, seconds),
    st.tuples(seconds, seconds).map(lambda bounds: Latency.uniform(*sorted(bounds))),
    st.builds(Latency.exponential, seconds, st.none() | seconds),
    st.builds(Latency.lognormal, seconds, st.floats(0, 1e6), st.none() | seconds),
)


@given(latency=latencies, seed=st.integers(0, 2**32))
def test_latency_samples_stay_within_zero_and_cap(latency: Latency, seed: int) -> None:
    """Every distribution's samples are finite, never negative and never above the cap."""
    rng = random.Random(seed)
    for _ in range(20):
        delay_s = latency.sample(rng)
        assert 0.0 <= latency.low_s <= delay_s <= latency.cap_s


def test_default_caps_are_ten_times_the_centre() -> None:
    """Exponential and lognormal latencies without a cap stop at 10x their mean / median."""
    assert Latency.exponential(0.5).cap_s == 5.0
    assert Latency.lognormal(0.2, 1.0).cap_s == 2.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Latency.fixed(0.0)),
        ("0.01", Latency.fixed(0.01)),
        ("2s", Latency.fixed(2.0)),
        ("0.5-3s", Latency.uniform(0.5, 3.0)),
        ("0.5-3", Latency.uniform(0.5, 3.0)),
        ("fixed:2", Latency.fixed(2.0)),
        ("uniform:0.001:0.01", Latency.uniform(0.001, 0.01)),
        ("exp:0.005", Latency.exponential(0.005)),
        (" EXPONENTIAL:0.005:1 ", Latency.exponential(0.005, 1.0)),
        ("lognormal:0.005:0.5", Latency.lognormal(0.005, 0.5)),
        ("lognormal:0.005:0.5:2", Latency.lognormal(0.005, 0.5, 2.0)),
    ],
)
def test_parse_reads_the_short_forms(text: str, expected: Latency) -> None:
    """Each distribution's CLI form parses to the latency its constructor builds."""
    assert Latency.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("abc", "value_s 'abc' is not a number"),
        ("", "value_s '' is not a number"),
        ("-0.5", "value_s must be a finite number"),
        ("inf", "value_s must be a finite number"),
        ("gauss:1", "unknown distribution 'gauss'"),
        ("uniform:0.1", "expected uniform:low_s:high_s, got 1"),
        ("uniform:0.1:x", "high_s 'x' is not a number"),
        ("uniform:0.5:0.1", "low_s (0.5) must not be above high_s (0.1)"),
        ("3-0.5s", "low_s (3.0) must not be above high_s (0.5)"),
        ("1-xs", "high_s 'x' is not a number"),
        ("exp:-1", "mean_s must be a finite number"),
        ("exp:1:2:3", "expected exp:mean_s[:cap_s], got 3"),
        ("lognormal:1:nan", "sigma must be a finite number"),
        ("lognormal:1:0.5:-2", "cap_s must be a finite number"),
    ],
)
def test_parse_errors_name_the_bad_part(text: str, names: str) -> None:
    """A bad latency string is rejected with the whole string and the part that was wrong."""
    with pytest.raises(ValueError) as caught:
        Latency.parse(text)
    assert str(caught.value).startswith(f"invalid latency {text!r}: ")
    assert names in str(caught.value)


def test_latency_built_directly_is_validated() -> None:
    """Constructing a Latency field by field checks its kind and bounds, naming the field."""
    with pytest.raises(ValueError, match=r"Latency\.kind"):
        Latency("gauss")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Latency\.low_s \(2\.0\) must not be above cap_s"):
        Latency("uniform", 1.5, 2.0, 1.0)
    with pytest.raises(ValueError, match=r"Latency\.sigma"):
        Latency("lognormal", 1.0, 0.0, 10.0, -1.0)


@pytest.mark.parametrize("field", list(FAIL_RATE_SHARES))
@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan])
def test_profile_rejects_a_probability_outside_zero_one(field: str, value: float) -> None:
    """A failure probability outside [0, 1] (or NaN) is rejected, naming the field."""
    with pytest.raises(ValueError, match=rf"SimulationProfile\.{field} must be a probability"):
        SimulationProfile(**{field: value})  # type: ignore[arg-type]


def test_profile_rejects_run_outcomes_above_one() -> None:
    """kernel_nonzero_exit and oom_killed are exclusive outcomes of a run: their sum is <= 1."""
    with pytest.raises(ValueError, match=r"kernel_nonzero_exit \+ oom_killed must not exceed 1"):
        SimulationProfile(kernel_nonzero_exit=0.7, oom_killed=0.6)


@pytest.mark.parametrize("fail_rate", [-0.01, 1.01, math.nan])
def test_with_fail_rate_rejects_a_rate_outside_zero_one(fail_rate: float) -> None:
    """with_fail_rate names its argument when the rate is not a probability."""
    with pytest.raises(ValueError, match="fail_rate must be a probability"):
        SimulationProfile.with_fail_rate(fail_rate)


@given(fail_rate=st.floats(0.0, 1.0))
def test_with_fail_rate_probabilities_combine_to_the_rate(fail_rate: float) -> None:
    """The stages' survival chances multiply to 1 - f; the run splits 3:1 nonzero exit : OOM."""
    profile = SimulationProfile.with_fail_rate(fail_rate)
    survive = (
        (1 - profile.image_pull_failure)
        * (1 - profile.kernel_start_failure)
        * (1 - profile.kernel_nonzero_exit - profile.oom_killed)
    )
    assert 1 - survive == pytest.approx(fail_rate, abs=1e-9)
    assert profile.kernel_nonzero_exit == pytest.approx(3 * profile.oom_killed)
    assert profile.image_pull_failure == profile.kernel_start_failure <= fail_rate


@pytest.mark.parametrize("fail_rate", [0.02, 0.1, 0.5])
async def test_with_fail_rate_fails_about_that_share_of_kernels(fail_rate: float) -> None:
    """Over 20,000 seeded kernels the share that fails somewhere is close to f, every cause seen."""
    runtime = SimulatedRuntime(SimulationProfile.with_fail_rate(fail_rate), rng=random.Random(11))
    n = 20_000
    results = [await run_one(runtime) for _ in range(n)]
    failed = n - results.count("ok")
    tolerance = 6 * math.sqrt(fail_rate * (1 - fail_rate) / n) + 0.002
    assert abs(failed / n - fail_rate) <= tolerance
    assert set(results) == {"ok", *FAIL_RATE_SHARES}


@pytest.mark.parametrize(
    "profile", [SimulationProfile(), SimulationProfile.with_fail_rate(0.0)], ids=["default", "f=0"]
)
async def test_probability_zero_never_fails(profile: SimulationProfile) -> None:
    """With every failure probability 0 (the default, with_fail_rate(0)) every kernel exits 0."""
    runtime = SimulatedRuntime(profile, rng=random.Random(3))
    assert {await run_one(runtime) for _ in range(2_000)} == {"ok"}


async def test_probability_one_fails_every_image_pull() -> None:
    """image_pull_failure = 1 fails every preload, retryably."""
    runtime = SimulatedRuntime(SimulationProfile(image_pull_failure=1.0))
    for _ in range(100):
        with pytest.raises(StageFailure) as caught:
            await runtime.preload(launch())
        assert (caught.value.cause, caught.value.retryable) == ("image_pull_failure", True)


async def test_probability_one_fails_every_start() -> None:
    """kernel_start_failure = 1 lets preload pass and fails every start, not retryably."""
    runtime = SimulatedRuntime(SimulationProfile(kernel_start_failure=1.0))
    for _ in range(100):
        await runtime.preload(launch())
        with pytest.raises(StageFailure) as caught:
            await runtime.start(launch())
        assert (caught.value.cause, caught.value.retryable) == ("kernel_start_failure", False)


@pytest.mark.parametrize(
    ("field", "exit_code", "failure_cause"),
    [("kernel_nonzero_exit", 1, None), ("oom_killed", -9, "oom_killed")],
)
async def test_probability_one_ends_every_run_that_way(
    field: str, exit_code: int, failure_cause: str | None
) -> None:
    """A run-stage cause at 1 ends every run with its exit code and failure cause."""
    runtime = SimulatedRuntime(SimulationProfile(**{field: 1.0}))  # type: ignore[arg-type]
    for _ in range(100):
        ended = await (await runtime.start(launch())).wait()
        assert (ended.exit_code, ended.failure_cause) == (exit_code, failure_cause)


async def test_seeded_runs_are_reproducible() -> None:
    """Two runtimes seeded alike draw the same latencies and the same faults."""
    profile = replace(
        SimulationProfile.with_fail_rate(0.3),
        preload=Latency.uniform(0.0, 1.0),
        run=Latency.lognormal(0.1, 1.0),
    )
    runs = []
    for _ in range(2):
        sleep = RecordingSleep()
        runtime = SimulatedRuntime(profile, rng=random.Random(42), sleep=sleep)
        runs.append(([await run_one(runtime) for _ in range(300)], sleep.delays))
    assert runs[0] == runs[1]


async def test_each_stage_waits_its_latency_through_the_injected_sleep() -> None:
    """preload, start, run and stop each ask the injected sleep for their latency, in order."""
    profile = SimulationProfile(
        preload=Latency.fixed(0.1), start=Latency.fixed(0.2), run=Latency.fixed(0.3)
    )
    sleep = RecordingSleep()
    runtime = SimulatedRuntime(replace(profile, stop=Latency.fixed(0.4)), sleep=sleep)
    assert await run_one(runtime) == "ok"
    kernel = await runtime.start(launch(SessionType.INTERACTIVE))
    assert (await kernel.terminate(grace_s=1.0)).exit_code == -15
    assert sleep.delays == [0.1, 0.2, 0.3, 0.2, 0.4]


async def test_zero_latencies_never_await_the_sleep() -> None:
    """A latency sampled as 0 skips the await: the fast profile never calls sleep."""
    sleep = RecordingSleep()
    runtime = SimulatedRuntime(sleep=sleep)
    assert await run_one(runtime) == "ok"
    await (await runtime.start(launch(SessionType.INFERENCE))).terminate(grace_s=0.0)
    assert sleep.delays == []


async def test_terminate_wakes_a_pending_wait_and_is_idempotent() -> None:
    """terminate ends a running kernel with -15, wakes wait(), and returns the same exit again."""
    profile = SimulationProfile(run=Latency.fixed(10.0))
    runtime = SimulatedRuntime(profile, sleep=RecordingSleep(block=True))
    kernel = await runtime.start(launch())
    waiter = asyncio.create_task(kernel.wait())
    await asyncio.sleep(0)
    assert not waiter.done()
    ended = await kernel.terminate(grace_s=5.0)
    assert ended.exit_code == -15
    assert await waiter is ended
    assert await kernel.terminate(grace_s=5.0) is ended
    assert await kernel.wait() is ended


async def test_concurrent_terminates_share_one_stop() -> None:
    """Two terminates at once wait one stop latency and report the same exit."""
    sleep = RecordingSleep()
    runtime = SimulatedRuntime(SimulationProfile(stop=Latency.fixed(0.5)), sleep=sleep)
    kernel = await runtime.start(launch(SessionType.INTERACTIVE))
    first, second = await asyncio.gather(kernel.terminate(1.0), kernel.terminate(1.0))
    assert first is second
    assert sleep.delays == [0.5]


async def test_a_stop_longer_than_the_grace_period_is_a_kill() -> None:
    """When the stop latency exceeds grace_s the kernel is killed (-9) after grace_s."""
    sleep = RecordingSleep()
    runtime = SimulatedRuntime(SimulationProfile(stop=Latency.fixed(5.0)), sleep=sleep)
    kernel = await runtime.start(launch(SessionType.INTERACTIVE))
    ended = await kernel.terminate(grace_s=1.0)
    assert (ended.exit_code, ended.failure_cause) == (-9, None)
    assert sleep.delays == [1.0]


async def test_terminate_after_a_natural_end_reports_that_end() -> None:
    """A kernel that already exited keeps its exit; terminate waits no stop latency."""
    sleep = RecordingSleep()
    profile = SimulationProfile(oom_killed=1.0, stop=Latency.fixed(1.0))
    kernel = await SimulatedRuntime(profile, sleep=sleep).start(launch())
    assert (await kernel.terminate(grace_s=5.0)).failure_cause == "oom_killed"
    assert sleep.delays == []


@pytest.mark.parametrize("session_type", [SessionType.INTERACTIVE, SessionType.INFERENCE])
async def test_serving_kernels_do_not_end_by_themselves(session_type: SessionType) -> None:
    """INTERACTIVE and INFERENCE kernels draw no run latency and wait until terminated."""
    sleep = RecordingSleep()
    profile = SimulationProfile(run=Latency.fixed(1.0), kernel_nonzero_exit=1.0)
    kernel = await SimulatedRuntime(profile, sleep=sleep).start(launch(session_type))
    waiter = asyncio.create_task(kernel.wait())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    assert sleep.delays == []
    assert (await kernel.terminate(grace_s=1.0)).exit_code == -15
    assert (await waiter).exit_code == -15


async def test_a_cancelled_waiter_leaves_the_kernel_intact() -> None:
    """Cancelling one wait() neither ends the kernel nor cancels the other waiters."""
    runtime = SimulatedRuntime(
        SimulationProfile(run=Latency.fixed(10.0)), sleep=RecordingSleep(block=True)
    )
    kernel = await runtime.start(launch())
    cancelled, other = asyncio.create_task(kernel.wait()), asyncio.create_task(kernel.wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert not other.done()
    ended = await kernel.terminate(grace_s=1.0)
    assert await other is ended
    assert await kernel.wait() is ended


async def test_read_log_slices_the_deterministic_lines() -> None:
    """stdout holds the banner (plus the exit line once ended), stderr the failure; both sliced."""
    kernel = await SimulatedRuntime().start(launch(SessionType.INTERACTIVE, rank=1, size=4))
    banner = f"simulated kernel {KERNEL_ID} rank 1/4\n".encode()
    assert await kernel.read_log("stdout", 0, 1 << 20) == banner
    assert await kernel.read_log("stdout", 5, 10) == banner[5:15]
    assert await kernel.read_log("stdout", len(banner), 100) == b""
    assert await kernel.read_log("stderr", 0, 100) == b""
    await kernel.terminate(grace_s=1.0)
    exit_line = f"simulated kernel {KERNEL_ID} exited with code -15\n".encode()
    assert await kernel.read_log("stdout", len(banner), 100) == exit_line
    assert await kernel.read_log("stderr", 0, 100) == b"simulated: terminated\n"
    assert await kernel.read_log("stderr", 11, 4) == b"term"


async def test_read_log_rejects_unknown_streams_and_negative_ranges() -> None:
    """An unknown stream or a negative offset / limit is an error, not an empty read."""
    kernel = await SimulatedRuntime().start(launch())
    with pytest.raises(ValueError, match="unknown log stream 'stdin'"):
        await kernel.read_log("stdin", 0, 10)
    with pytest.raises(ValueError, match="must be >= 0"):
        await kernel.read_log("stdout", -1, 10)


async def test_a_simulated_kernel_has_no_outputs() -> None:
    """list_outputs is empty and read_output raises FileNotFoundError."""
    kernel = await SimulatedRuntime().start(launch())
    assert await kernel.list_outputs() == []
    with pytest.raises(FileNotFoundError):
        await kernel.read_output("model.pt")


async def test_runtime_facts_and_notes() -> None:
    """Name, black box, the kernel's host, and one startup note line describing the profile."""
    profile = SimulationProfile(preload=Latency.parse("uniform:0.001:0.01"), oom_killed=0.25)
    runtime: Runtime = SimulatedRuntime(profile, host="node-7")
    assert (runtime.name, runtime.black_box) == ("simulated", False)
    assert (await runtime.start(launch())).info == {"host": "node-7"}
    (line,) = SimulatedRuntime(profile).notes().lines
    assert "preload uniform:0.001:0.01" in line
    assert "oom_killed 0.25" in line


async def test_the_journal_records_each_start_and_how_each_kernel_ended(tmp_path: Path) -> None:
    """With a journal, a start (with its placement) and the kernel's end (exited by itself, or
    stopped) are recorded."""
    journal = Journal(tmp_path / "journal.jsonl")
    runtime = SimulatedRuntime(
        SimulationProfile(run=Latency.fixed(5.0)), sleep=RecordingSleep(block=True), journal=journal
    )
    stopped = await runtime.start(launch())
    await stopped.terminate(grace_s=1.0)
    quick = SimulatedRuntime(journal=journal)
    ended = await quick.start(replace(launch(), kernel_id=KernelId(uuid.UUID(int=7)), attempt=3))
    assert (await ended.wait()).exit_code == 0
    journal.close()
    events = [
        (e["event"], e["kernel"], e.get("attempt"), e.get("how"))
        for e in read_journal(journal.path)
    ]
    assert events == [
        ("start", str(KERNEL_ID), 0, None),
        ("end", str(KERNEL_ID), None, "terminated"),
        ("start", str(uuid.UUID(int=7)), 3, None),
        ("end", str(uuid.UUID(int=7)), None, "exited"),
    ]


async def test_a_restart_is_journaled_with_its_number_and_adopted_as_it(
    tmp_path: Path,
) -> None:
    """A restart's start carries its restart number; the next agent finds the kernel as that
    restart (its info says so), so it counts on from it instead of starting it again."""
    journal = Journal(tmp_path / "journal.jsonl")
    runtime = SimulatedRuntime(journal=journal)
    await (await runtime.start(replace(launch(), attempt=2, restart=1))).wait()
    assert [e.get("restart") for e in read_journal(journal.path) if e["event"] == "start"] == [1]
    adoption = runtime.adoption
    assert adoption is not None
    (left,) = await adoption.find_left(tmp_path)
    adopted = await adoption.adopt(left, replace(launch(), attempt=2))
    assert adopted.info["restart"] == 1
    journal.close()


def test_a_torn_journal_line_is_skipped(tmp_path: Path) -> None:
    """A line cut short by a kill mid-write is left out; the whole lines before it are read."""
    path = tmp_path / "journal.jsonl"
    path.write_text('{"event": "boot", "t": 1}\n{"event": "sta')
    assert [e["event"] for e in read_journal(path)] == ["boot"]


async def test_the_next_agent_adopts_each_journaled_kernel_as_it_ended(
    tmp_path: Path,
) -> None:
    """The next agent finds every kernel its journal shows started and not discarded, with its
    placement: one never ended died with its agent (adopted as lost), one that ended is adopted
    with its exit (the manager may not have heard it), another is discarded (journaled
    forgotten). An agent killed again finds the adopted two once more, both ended; discarded,
    they are gone."""
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    dead = SimulatedRuntime(SimulationProfile(run=Latency.fixed(60.0)), journal=journal)
    exited, other = KernelId(uuid.UUID(int=5)), KernelId(uuid.UUID(int=9))
    await dead.start(replace(launch(), attempt=2))
    await dead.start(replace(launch(), kernel_id=other))
    oom = SimulatedRuntime(
        SimulationProfile(oom_killed=1.0, run=Latency.fixed(0.0)), journal=journal
    )
    assert (await (await oom.start(replace(launch(), kernel_id=exited))).wait()) == OOM_KILLED
    journal.close()  # the agent dies: its running kernels with it

    journal = Journal(path)
    adoption = SimulatedRuntime(journal=journal).adoption
    assert adoption is not None
    left = {k.kernel_id: k for k in await adoption.find_left(tmp_path / "kernels")}
    assert set(left) == {KERNEL_ID, other, exited}
    assert left[KERNEL_ID].attempt == 2  # type: ignore[attr-defined]
    lost = await adoption.adopt(left[KERNEL_ID], launch())
    assert await lost.wait() == KernelExit(
        None, KERNEL_LOST_CAUSE, "simulated: the kernel died with its agent"
    )
    ended = await adoption.adopt(left[exited], replace(launch(), kernel_id=exited))
    assert (await ended.wait()).exit_code == OOM_KILLED.exit_code
    assert (await ended.wait()).failure_cause == OOM_KILLED.failure_cause
    await adoption.discard(left[other])
    again = {k.kernel_id: k for k in await adoption.find_left(tmp_path / "kernels")}
    assert set(again) == {KERNEL_ID, exited}
    lost_again = again[KERNEL_ID].ended  # type: ignore[attr-defined]
    assert (lost_again.exit_code, lost_again.failure_cause) == (None, KERNEL_LOST_CAUSE)
    for kernel in again.values():
        await adoption.discard(kernel)
    assert await adoption.find_left(tmp_path / "kernels") == []
    journal.close()


def test_without_a_journal_the_simulated_runtime_cannot_adopt() -> None:
    """Nothing records what an in-process simulated agent started: no adoption."""
    assert SimulatedRuntime().adoption is None
