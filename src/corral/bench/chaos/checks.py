"""The chaos run's checks: pure functions from what was recorded to the violations found.

Each takes plain data (database rows, agents' journal events, ledger samples) so it is tested
against data that violates it and data that satisfies it, without a cluster.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.agent.runtime.sim_journal import EndHow, JournalEvent
from corral.domain.lifecycle import TransitionTable
from corral.domain.status import (
    KERNEL_TRANSITIONS,
    SESSION_TRANSITIONS,
    KernelStatus,
    SessionStatus,
)

MAX_EXAMPLES = 5
TERMINAL = frozenset(SESSION_TRANSITIONS.terminal)

# agent -> slot -> (capacity, occupied), as `store.agents.read_ledger` reads it.
Ledger = Mapping[Any, Mapping[str, Sequence[int]]]


class CheckName(enum.StrEnum):
    """The checks, in the report's order."""

    ALL_TERMINAL = "every_accepted_session_terminal"
    NO_DOUBLE_START = "no_kernel_started_twice"
    NO_OVERCOMMIT = "no_overcommit"
    LEDGER_MATCHES = "ledger_equals_kernel_slots"
    LEGAL_HISTORY = "every_history_edge_legal"
    NO_EXIT = "no_process_exited_by_itself"


@dataclass
class CheckResult:
    """One check: how many violations, and a few examples of them."""

    name: CheckName
    checked: int = 0  # how many things it looked at
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def violated(self, example: str) -> None:
        """Count a violation; keep its description if there are few so far."""
        self.violations += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example)

    @property
    def ok(self) -> bool:
        """No violation."""
        return self.violations == 0


def all_terminal(accepted: Iterable[str], statuses: Mapping[str, str]) -> CheckResult:
    """Every accepted session exists and is in a terminal status."""
    result = CheckResult(CheckName.ALL_TERMINAL)
    for session_id in accepted:
        result.checked += 1
        status = statuses.get(session_id)
        if status is None:
            result.violated(f"session {session_id} was accepted but is not in the database")
        elif SessionStatus(status) not in TERMINAL:
            result.violated(f"session {session_id} is still {status}")
    return result


def no_double_start(journals: Mapping[str, Sequence[Mapping[str, Any]]]) -> CheckResult:
    """No kernel starts twice for one placement, nor again after it ran to its end.

    A placement is the kernel's attempt number (the manager bumps it each time the kernel is
    placed): a kernel stopped, or lost with its agent before it started, may be placed again and
    start under a new attempt. The same attempt starting twice (on one agent after a restart, or
    on two) ran one placement twice; a kernel that exited by itself is finished and must never
    start again under any attempt, with one exception: the restart policy (`domain.restarts`)
    starts a kernel that exited non-zero again, on the same agent, under the same placement and
    with a higher restart number. That is a counted new start, never a duplicate.
    """
    result = CheckResult(CheckName.NO_DOUBLE_START)
    started: dict[tuple[str, str, int], str] = {}  # (kernel, attempt, restart) -> its agent
    # kernel -> (the agent on which it ran to its end, attempt, restart, exit code)
    finished: dict[str, tuple[str, str, int, Any]] = {}
    running: dict[str, tuple[str, str, int]] = {}  # kernel -> (agent, attempt, restart)
    for agent, kernel, attempt, restart, event, line in _merged(journals):
        how = str(line.get("how", ""))
        if event == JournalEvent.BOOT:
            for lost in [k for k, run in running.items() if run[0] == agent]:
                del running[lost]
            continue
        if event == JournalEvent.START:
            result.checked += 1
            placement = (kernel, attempt, restart)
            if kernel in finished and _restarts(finished[kernel], agent, attempt, restart):
                del finished[kernel]  # its last run failed: this one may finish it
            if kernel in finished:
                result.violated(
                    f"kernel {kernel} started on {agent} after it ran to its end on "
                    f"{finished[kernel][0]}"
                )
            elif placement in started:
                result.violated(
                    f"kernel {kernel} placement {attempt} started on {agent} after it started "
                    f"on {started[placement]}"
                )
            elif kernel in running:
                result.violated(
                    f"kernel {kernel} started on {agent} while running on {running[kernel][0]}"
                )
            started[placement] = agent
            running[kernel] = (agent, attempt, restart)
        elif event == JournalEvent.END and kernel in running and running[kernel][0] == agent:
            _, run_attempt, run_restart = running.pop(kernel)
            if how == EndHow.EXITED:
                finished[kernel] = (agent, run_attempt, run_restart, line.get("exit_code"))
    return result


def _restarts(ended: tuple[str, str, int, Any], agent: str, attempt: str, restart: int) -> bool:
    """Whether a start is the restart policy's, after the kernel's run `ended`: on its agent,
    under its placement, a higher restart number, after a non-zero exit."""
    ended_agent, ended_attempt, ended_restart, exit_code = ended
    return (
        (ended_agent, ended_attempt) == (agent, attempt)
        and restart > ended_restart
        and isinstance(exit_code, int)
        and exit_code != 0
    )


def _merged(
    journals: Mapping[str, Sequence[Mapping[str, Any]]],
) -> list[tuple[str, str, str, int, str, Mapping[str, Any]]]:
    """Every agent's events as (agent, kernel, attempt, restart, event, line), by time (stable
    per agent)."""
    events = [
        (float(line["t"]), agent, index, line)
        for agent, lines in journals.items()
        for index, line in enumerate(lines)
    ]
    events.sort(key=lambda item: (item[0], item[1], item[2]))
    return [
        (
            agent,
            str(line.get("kernel", "")),
            str(line.get("attempt", 0)),
            int(line.get("restart") or 0),
            str(line["event"]),
            line,
        )
        for _, agent, _, line in events
    ]


def no_overcommit(
    samples: Iterable[Ledger],
    journals: Mapping[str, Sequence[Mapping[str, Any]]],
    capacity: Mapping[str, Mapping[str, int]],
) -> CheckResult:
    """No sampled ledger row above capacity or below 0, and no agent ran more than it has."""
    result = CheckResult(CheckName.NO_OVERCOMMIT)
    for sample in samples:
        for agent, slots in sample.items():
            for slot, (cap, occupied) in slots.items():
                result.checked += 1
                if not 0 <= occupied <= cap:
                    result.violated(f"ledger: {agent} {slot} occupied {occupied} of {cap}")
    for agent, lines in journals.items():
        held: dict[str, Mapping[str, int]] = {}
        limit = capacity.get(agent, {})
        for line in lines:
            event, kernel = line["event"], str(line.get("kernel", ""))
            if event == JournalEvent.BOOT:
                held.clear()
            elif event == JournalEvent.START:
                held[kernel] = line.get("slots", {})
                result.checked += 1
                for slot, cap in limit.items():
                    used = sum(int(s.get(slot, 0)) for s in held.values())
                    if used > cap:
                        result.violated(f"agent {agent} ran {used} of {slot} (capacity {cap})")
            elif event == JournalEvent.END:
                held.pop(kernel, None)
    return result


def ledger_matches(
    ledger: Ledger, kernel_slots: Iterable[tuple[str, Mapping[str, int]]]
) -> CheckResult:
    """Each agent's occupied slots equal the sum of its kernels' occupied slots."""
    result = CheckResult(CheckName.LEDGER_MATCHES)
    held: dict[str, dict[str, int]] = {}
    for agent, slots in kernel_slots:
        for slot, amount in slots.items():
            held.setdefault(agent, {})[slot] = held.get(agent, {}).get(slot, 0) + int(amount)
    for agent in sorted(set(ledger) | set(held)):
        rows = ledger.get(agent, {})
        for slot in sorted(set(rows) | set(held.get(agent, {}))):
            result.checked += 1
            occupied = int(rows[slot][1]) if slot in rows else 0
            expected = held.get(agent, {}).get(slot, 0)
            if occupied != expected:
                result.violated(
                    f"ledger: {agent} {slot} occupied {occupied}, its kernels hold {expected}"
                )
    return result


def legal_history(
    session_edges: Iterable[tuple[str | None, str | None, int]],
    kernel_edges: Iterable[tuple[str | None, str | None, int]],
) -> CheckResult:
    """Every (from, to) move in the session and kernel histories is an edge of the state law."""
    result = CheckResult(CheckName.LEGAL_HISTORY)
    _edges(result, "session", session_edges, SESSION_TRANSITIONS, SessionStatus)
    _edges(result, "kernel", kernel_edges, KERNEL_TRANSITIONS, KernelStatus)
    return result


def _edges(
    result: CheckResult,
    what: str,
    edges: Iterable[tuple[str | None, str | None, int]],
    table: TransitionTable[Any],
    enum_type: type[SessionStatus] | type[KernelStatus],
) -> None:
    for before, after, count in edges:
        result.checked += count
        # A row without a move (a refused or retried attempt) records no transition.
        if before is None or after is None or before == after:
            continue
        try:
            legal = table.allowed(enum_type(before), enum_type(after))
        except ValueError:
            legal = False
        if not legal:
            for _ in range(count):
                result.violated(f"{what} history: {before} -> {after}")


def no_exit(exits: Iterable[tuple[str, int | None]], samples: int) -> CheckResult:
    """No manager or agent ended by itself (the harness restarts it and counts it here)."""
    result = CheckResult(CheckName.NO_EXIT, checked=samples)
    for name, code in exits:
        result.violated(f"{name} exited by itself with code {code}")
    return result
