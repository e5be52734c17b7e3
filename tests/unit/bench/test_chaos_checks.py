"""The chaos harness's checks find what violates them and pass what does not."""

from __future__ import annotations

from typing import Any

from corral.agent.runtime.sim_journal import EndHow, JournalEvent
from corral.bench.chaos import checks

CPU = {"cpu": 1000}


def _start(
    t: float, kernel: str, slots: dict[str, int] = CPU, *, attempt: int = 0, restart: int = 0
) -> dict[str, Any]:
    return {
        "event": JournalEvent.START.value,
        "t": t,
        "kernel": kernel,
        "attempt": attempt,
        "restart": restart,
        "slots": slots,
    }


def _end(t: float, kernel: str, how: EndHow, exit_code: int | None = None) -> dict[str, Any]:
    return {
        "event": JournalEvent.END.value,
        "t": t,
        "kernel": kernel,
        "how": how.value,
        "exit_code": exit_code,
    }


def _boot(t: float) -> dict[str, Any]:
    return {"event": JournalEvent.BOOT.value, "t": t}


def test_a_session_not_terminal_or_missing_is_a_violation() -> None:
    """Accepted sessions still RUNNING or absent from the database are counted; ended ones pass."""
    result = checks.all_terminal(
        ["a", "b", "c", "d"], {"a": "TERMINATED", "b": "RUNNING", "d": "CANCELLED"}
    )
    assert (result.checked, result.violations) == (4, 2)
    assert any("b is still RUNNING" in e for e in result.examples)
    assert any("c was accepted but is not" in e for e in result.examples)
    assert checks.all_terminal(["a"], {"a": "ERROR"}).ok


def test_a_kernel_started_again_after_it_ran_to_its_end_is_a_violation() -> None:
    """A batch kernel that exited on one agent and started on another ran twice."""
    journals = {
        "a1": [_start(1, "k"), _end(2, "k", EndHow.EXITED)],
        "a2": [_start(3, "k")],
    }
    result = checks.no_double_start(journals)
    assert result.violations == 1
    assert "after it ran to its end on a1" in result.examples[0]


def test_a_kernel_started_while_it_runs_elsewhere_is_a_violation() -> None:
    """Two agents running the same kernel at once: one placement started twice."""
    journals = {"a1": [_start(1, "k")], "a2": [_start(2, "k")]}
    assert checks.no_double_start(journals).violations == 1


def test_a_kernel_stopped_or_lost_may_start_again_as_a_new_placement() -> None:
    """A kernel its agent stopped, or lost with a restart, may be placed and started anew: the
    manager's next placement has the next attempt number."""
    journals = {
        "a1": [
            _start(1, "k"),
            _end(2, "k", EndHow.TERMINATED),
            _start(3, "j"),
            _boot(4),
        ],
        "a2": [_start(5, "k", attempt=1), _end(6, "k", EndHow.EXITED), _start(7, "j", attempt=1)],
    }
    result = checks.no_double_start(journals)
    assert result.ok, result.examples
    assert result.checked == 4


def test_one_placement_started_again_after_its_agent_restarted_is_a_violation() -> None:
    """An agent killed after it started a kernel, which starts the same placement again when it
    comes back, ran the job twice although neither run ended by itself."""
    journals = {"a1": [_start(1, "k", attempt=2), _boot(2), _start(3, "k", attempt=2)]}
    result = checks.no_double_start(journals)
    assert result.violations == 1
    assert "placement 2 started on a1 after it started on a1" in result.examples[0]


def test_a_restart_after_a_nonzero_exit_is_a_counted_start_not_a_duplicate() -> None:
    """The restart policy: the same placement starts again on its agent, restart 1 after a
    non-zero exit, restart 2 after the next: three legitimate starts."""
    journal = [
        _start(1, "k", attempt=1),
        _end(2, "k", EndHow.EXITED, 3),
        _start(3, "k", attempt=1, restart=1),
        _end(4, "k", EndHow.EXITED, 3),
        _start(5, "k", attempt=1, restart=2),
    ]
    result = checks.no_double_start({"a1": journal})
    assert result.ok, result.examples
    assert result.checked == 3


def test_a_restart_number_started_twice_or_after_success_is_a_violation() -> None:
    """Restart 1 started twice (an agent that came back and started it again), a restart after
    an exit 0, or a restart on another agent: each ran something twice."""
    twice = [
        _start(1, "k", attempt=1),
        _end(2, "k", EndHow.EXITED, 3),
        _start(3, "k", attempt=1, restart=1),
        _boot(4),
        _start(5, "k", attempt=1, restart=1),
    ]
    assert checks.no_double_start({"a1": twice}).violations == 1
    after_success = [_start(1, "k"), _end(2, "k", EndHow.EXITED, 0), _start(3, "k", restart=1)]
    assert checks.no_double_start({"a1": after_success}).violations == 1
    elsewhere = {
        "a1": [_start(1, "k"), _end(2, "k", EndHow.EXITED, 3)],
        "a2": [_start(3, "k", restart=1)],
    }
    assert checks.no_double_start(elsewhere).violations == 1


def test_an_overcommitted_ledger_sample_is_a_violation() -> None:
    """A sampled slot row above capacity (or below zero) is counted; rows within pass."""
    samples = [{"a1": {"cpu": [4000, 3000]}}, {"a1": {"cpu": [4000, 5000]}, "a2": {"cpu": [1, -1]}}]
    result = checks.no_overcommit(samples, {}, {})
    assert (result.checked, result.violations) == (3, 2)


def test_an_agent_running_more_than_its_capacity_is_a_violation() -> None:
    """From the agent's own record: kernels running at once beyond its slots are counted."""
    journal = [_start(1, "k1", {"cpu": 3000}), _start(2, "k2", {"cpu": 2000})]
    result = checks.no_overcommit([], {"a1": journal}, {"a1": {"cpu": 4000}})
    assert result.violations == 1
    within = [_start(1, "k1", {"cpu": 3000}), _end(2, "k1", EndHow.EXITED), _start(3, "k2")]
    assert checks.no_overcommit([], {"a1": within}, {"a1": {"cpu": 4000}}).ok
    after_boot = [_start(1, "k1", {"cpu": 3000}), _boot(2), _start(3, "k2", {"cpu": 3000})]
    assert checks.no_overcommit([], {"a1": after_boot}, {"a1": {"cpu": 4000}}).ok


def test_a_ledger_that_disagrees_with_the_kernels_is_a_violation() -> None:
    """Occupied slots must equal the sum of the agent's kernels' occupied slots, both ways."""
    ledger = {"a1": {"cpu": [4000, 2000], "mem": [10, 0]}, "a2": {"cpu": [4000, 0]}}
    kernels = [("a1", {"cpu": 1000}), ("a1", {"cpu": 1000}), ("a2", {"cpu": 1000})]
    result = checks.ledger_matches(ledger, kernels)
    assert result.violations == 1
    assert "a2 cpu occupied 0, its kernels hold 1000" in result.examples[0]
    assert checks.ledger_matches(ledger, kernels[:2]).ok
    leaked = checks.ledger_matches({"a1": {"cpu": [4000, 1000]}}, [])
    assert leaked.violations == 1


def test_an_illegal_history_edge_is_a_violation() -> None:
    """A move the state law has no edge for (or an unknown status) is counted per row."""
    result = checks.legal_history(
        [("PENDING", "SCHEDULED", 5), ("TERMINATED", "RUNNING", 2), (None, "PENDING", 1)],
        [("CREATING", "RUNNING", 3), ("RUNNING", "BOGUS", 1), ("PENDING", "PENDING", 4)],
    )
    assert result.violations == 3
    assert "session history: TERMINATED -> RUNNING" in result.examples
    assert "kernel history: RUNNING -> BOGUS" in result.examples
    legal = checks.legal_history([("RUNNING", "TERMINATING", 1)], [("PREPARED", "CREATING", 1)])
    assert legal.ok


def test_a_process_that_exited_by_itself_is_a_violation() -> None:
    """Each manager or agent found ended on its own counts; none found passes."""
    result = checks.no_exit([("manager-1", 1)], samples=10)
    assert (result.checked, result.violations) == (10, 1)
    assert "manager-1 exited by itself with code 1" in result.examples
    assert checks.no_exit([], samples=10).ok
