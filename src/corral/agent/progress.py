"""The progress machine an agent drives for one kernel (spec document 3).

Work states follow one of two forward maps: the normal flow, where the three `*_COMPLETE`
milestones take the "is X required?" decisions, or the black-box flow for runtimes that cannot
report fine stages (PRELOADING and the other `BLACK_BOX_UNUSED` states never occur there).

The error and abort rules are the same in both modes, the union of what the document gives each:
ERROR, ABORTED and USER_REQUESTED_ABORT may be entered from any work state, and each has a closed
list of exits. ERROR → its origin (a retry), ABORTED or ABANDONED; corral enforces the origin
rule, the published library does not. ABORTED → REPORTED_FAILED, ABANDONED, ERROR (reporting
failed) or USER_REQUESTED_ABORT. USER_REQUESTED_ABORT → USER_ABORT_COMPLETE, ABANDONED or ERROR,
never back to ABORTED. So ERROR never follows ERROR, and ABANDONED follows only these three.

The kernel restart policy (`domain.restarts`) is this retry edge from GENERATING: a kernel
that exits non-zero goes GENERATING → ERROR → GENERATING, its error limit raised by the
session's restart limit (`agent.kernel_worker`).

A limit of N per state means N failed attempts: each ERROR entered from S counts one failure of
S, and once S has failed N times no move may enter S again. That refuses the retry ERROR → S (an
ERROR whose origin is ABORTED then has only ABANDONED left) and bounds the loop ABORTED →
USER_REQUESTED_ABORT → ERROR → ABORTED, so every run is finite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from types import MappingProxyType

from corral.domain.record import record
from corral.domain.status import KernelStatus
from corral.domain.types import utcnow


class Progress(StrEnum):
    """Where one kernel's execution stands on its agent (spec document 3)."""

    NOT_STARTED = "NOT_STARTED"
    ERROR = "ERROR"
    PRELOADING = "PRELOADING"
    PRELOADING_COMPLETE = "PRELOADING_COMPLETE"
    GENERATING = "GENERATING"
    GENERATION_COMPLETE = "GENERATION_COMPLETE"
    PENDING_POST_PROCESSING = "PENDING_POST_PROCESSING"
    POST_PROCESSING = "POST_PROCESSING"
    POST_PROCESSING_COMPLETE = "POST_PROCESSING_COMPLETE"
    PENDING_SAFETY_CHECK = "PENDING_SAFETY_CHECK"
    SAFETY_CHECKING = "SAFETY_CHECKING"
    SAFETY_CHECK_COMPLETE = "SAFETY_CHECK_COMPLETE"
    PENDING_SUBMIT = "PENDING_SUBMIT"
    SUBMITTING = "SUBMITTING"
    SUBMIT_COMPLETE = "SUBMIT_COMPLETE"
    COMPLETE = "COMPLETE"
    ABORTED = "ABORTED"
    REPORTED_FAILED = "REPORTED_FAILED"
    USER_REQUESTED_ABORT = "USER_REQUESTED_ABORT"
    USER_ABORT_COMPLETE = "USER_ABORT_COMPLETE"
    ABANDONED = "ABANDONED"


P = Progress
K = KernelStatus

TERMINAL: frozenset[Progress] = frozenset(
    {P.COMPLETE, P.REPORTED_FAILED, P.USER_ABORT_COMPLETE, P.ABANDONED}
)
# Entered from any work state; each has its own closed list of exits below.
EXCEPTION_STATES: frozenset[Progress] = frozenset({P.ERROR, P.ABORTED, P.USER_REQUESTED_ABORT})
WORK_STATES: frozenset[Progress] = frozenset(set(P) - TERMINAL - EXCEPTION_STATES)
ERROR_EXITS: frozenset[Progress] = frozenset({P.ABORTED, P.ABANDONED})  # plus the origin
ABORTED_EXITS: frozenset[Progress] = frozenset(
    {P.REPORTED_FAILED, P.ABANDONED, P.ERROR, P.USER_REQUESTED_ABORT}
)
USER_ABORT_EXITS: frozenset[Progress] = frozenset({P.USER_ABORT_COMPLETE, P.ABANDONED, P.ERROR})


def _table(rows: Mapping[Progress, Iterable[Progress]]) -> Mapping[Progress, frozenset[Progress]]:
    return MappingProxyType({state: frozenset(targets) for state, targets in rows.items()})


NORMAL_TRANSITIONS = _table(
    {
        P.NOT_STARTED: (
            P.PRELOADING,
            P.GENERATING,
            P.PENDING_POST_PROCESSING,
            P.PENDING_SAFETY_CHECK,
        ),
        P.PRELOADING: (P.PRELOADING_COMPLETE,),
        P.PRELOADING_COMPLETE: (P.GENERATING, P.PENDING_POST_PROCESSING, P.PENDING_SAFETY_CHECK),
        P.GENERATING: (P.GENERATION_COMPLETE,),
        P.GENERATION_COMPLETE: (
            P.PENDING_POST_PROCESSING,
            P.PENDING_SAFETY_CHECK,
            P.PENDING_SUBMIT,
            P.COMPLETE,
        ),
        P.PENDING_POST_PROCESSING: (P.POST_PROCESSING,),
        P.POST_PROCESSING: (P.POST_PROCESSING_COMPLETE,),
        P.POST_PROCESSING_COMPLETE: (P.PENDING_SAFETY_CHECK, P.PENDING_SUBMIT, P.COMPLETE),
        P.PENDING_SAFETY_CHECK: (P.SAFETY_CHECKING,),
        P.SAFETY_CHECKING: (P.SAFETY_CHECK_COMPLETE,),
        P.SAFETY_CHECK_COMPLETE: (P.PENDING_SUBMIT, P.COMPLETE),
        P.PENDING_SUBMIT: (P.SUBMITTING,),
        P.SUBMITTING: (P.SUBMIT_COMPLETE,),
        P.SUBMIT_COMPLETE: (P.COMPLETE,),
    }
)

BLACK_BOX_TRANSITIONS = _table(
    {
        P.NOT_STARTED: (P.GENERATING,),
        P.GENERATING: (P.PENDING_SUBMIT, P.PENDING_SAFETY_CHECK, P.COMPLETE),
        P.PENDING_SAFETY_CHECK: (P.SAFETY_CHECKING,),
        P.SAFETY_CHECKING: (P.PENDING_SUBMIT, P.COMPLETE),
        P.PENDING_SUBMIT: (P.SUBMITTING,),
        P.SUBMITTING: (P.SUBMIT_COMPLETE, P.COMPLETE),
        P.SUBMIT_COMPLETE: (P.COMPLETE,),
    }
)

# The backend does these stages internally in black-box mode, so the agent never enters them.
BLACK_BOX_UNUSED: frozenset[Progress] = frozenset(
    {
        P.PRELOADING,
        P.PRELOADING_COMPLETE,
        P.GENERATION_COMPLETE,
        P.PENDING_POST_PROCESSING,
        P.POST_PROCESSING,
        P.POST_PROCESSING_COMPLETE,
        P.SAFETY_CHECK_COMPLETE,
    }
)

DEFAULT_ERROR_LIMITS: Mapping[Progress, int] = MappingProxyType(
    {
        **dict.fromkeys(P, 1),
        # The documented defaults.
        P.PRELOADING: 3,
        P.GENERATING: 3,
        P.POST_PROCESSING: 3,
        P.SAFETY_CHECKING: 3,
        P.SUBMITTING: 10,
        # corral's: ABORTED notifies the manager over the network, like SUBMITTING.
        P.ABORTED: 10,
        P.USER_REQUESTED_ABORT: 3,
    }
)

# The kernel status the agent reports on entering each state; None leaves the status as it is.
# An abandoned kernel cannot be reported: the manager learns of it by other means (heartbeats).
KERNEL_STATUS: Mapping[Progress, KernelStatus | None] = MappingProxyType(
    {
        P.NOT_STARTED: None,
        P.ERROR: None,
        P.PRELOADING: K.PULLING,
        P.PRELOADING_COMPLETE: K.PREPARED,
        P.GENERATING: K.RUNNING,
        # The post-run stages (collect the outputs, check them, submit them).
        P.GENERATION_COMPLETE: K.TERMINATING,
        P.PENDING_POST_PROCESSING: K.TERMINATING,
        P.POST_PROCESSING: K.TERMINATING,
        P.POST_PROCESSING_COMPLETE: K.TERMINATING,
        P.PENDING_SAFETY_CHECK: K.TERMINATING,
        P.SAFETY_CHECKING: K.TERMINATING,
        P.SAFETY_CHECK_COMPLETE: K.TERMINATING,
        P.PENDING_SUBMIT: K.TERMINATING,
        P.SUBMITTING: K.TERMINATING,
        P.SUBMIT_COMPLETE: K.TERMINATING,
        P.COMPLETE: K.TERMINATED,
        P.ABORTED: None,
        P.REPORTED_FAILED: K.ERROR,
        P.USER_REQUESTED_ABORT: K.TERMINATING,
        P.USER_ABORT_COMPLETE: K.TERMINATED,
        P.ABANDONED: None,
    }
)


class ProgressError(Exception):
    """A kernel progress move that the rules of spec document 3 refuse."""

    def __init__(self, source: Progress, target: Progress | None, message: str) -> None:
        super().__init__(message)
        self.source, self.target = source, target


class IllegalTransitionError(ProgressError):
    """A move that is neither in the mode's forward map nor among the error and abort rules."""

    def __init__(self, source: Progress, target: Progress, allowed: Iterable[Progress], mode: str):
        unused = mode == "black-box" and target in BLACK_BOX_UNUSED
        note = f" ({target} is not used in black-box mode)" if unused else ""
        allowed_text = ", ".join(sorted(allowed))
        super().__init__(
            source,
            target,
            f"{source} → {target} is not a {mode}-mode transition{note}; "
            f"from {source} the rules allow only {allowed_text}",
        )


class TerminalStateError(ProgressError):
    """A move out of a terminal state."""

    def __init__(self, source: Progress, target: Progress) -> None:
        why = f"{source} is terminal; a new attempt needs a new KernelProgress"
        super().__init__(source, target, f"{source} → {target} is refused: {why}")


class ErrorOriginError(ProgressError):
    """A move out of ERROR to somewhere other than its origin, ABORTED or ABANDONED."""

    def __init__(self, origin: Progress, target: Progress) -> None:
        self.origin = origin
        why = f"an error in {origin} may go back only to {origin}, or to ABORTED or ABANDONED"
        super().__init__(P.ERROR, target, f"ERROR → {target} is refused: {why}")


class RepeatedErrorError(ProgressError):
    """ERROR entered from ERROR."""

    def __init__(self, origin: Progress) -> None:
        self.origin = origin
        why = f"handle the error in {origin} first (retry, abort or abandon)"
        super().__init__(P.ERROR, P.ERROR, f"ERROR → ERROR is refused: {why}")


class ErrorLimitExceededError(ProgressError):
    """A move into a state that has already failed as often as its error limit allows."""

    def __init__(self, source: Progress, state: Progress, limit: int) -> None:
        self.state, self.limit = state, limit
        why = f"{state} has failed {limit} time(s), its error limit; abort or abandon instead"
        super().__init__(source, state, f"{source} → {state} is refused: {why}")


def merge_error_limits(overrides: Mapping[Progress, int] | None = None) -> Mapping[Progress, int]:
    """The default error limits with `overrides` merged over them, validated."""
    limits = dict(DEFAULT_ERROR_LIMITS)
    for key, limit in (overrides or {}).items():
        try:
            state = Progress(key)
        except ValueError:
            raise ValueError(
                f"error limit for unknown progress state {key!r}; known: {', '.join(P)}"
            ) from None
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"error limit for {state} must be a positive int, got {limit!r}")
        limits[state] = limit
    return MappingProxyType(limits)


def rule_targets(
    state: Progress, forward: Mapping[Progress, frozenset[Progress]]
) -> frozenset[Progress]:
    """Where the rules let `state` go, before error limits (ERROR's origin not included)."""
    if state in TERMINAL:
        return frozenset()
    if state == P.ERROR:
        return ERROR_EXITS
    if state == P.ABORTED:
        return ABORTED_EXITS
    if state == P.USER_REQUESTED_ABORT:
        return USER_ABORT_EXITS
    return forward.get(state, frozenset()) | EXCEPTION_STATES


def _targets_by_state(
    forward: Mapping[Progress, frozenset[Progress]],
) -> Mapping[Progress, frozenset[Progress]]:
    """`rule_targets` of every state, worked out once (a move checks its source's)."""
    return MappingProxyType({state: rule_targets(state, forward) for state in P})


def _closure(
    start: Progress, forward: Mapping[Progress, frozenset[Progress]], *, leave_error: bool = True
) -> set[Progress]:
    """Every state the rules reach from `start`; with leave_error=False, ERROR is a dead end."""
    seen, todo = {start}, [start]
    while todo:
        state = todo.pop()
        if state == P.ERROR and not leave_error:
            continue
        for nxt in rule_targets(state, forward) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def check_tables() -> None:
    """Raise ValueError if the tables above contradict each other or the rules of the module."""
    problems = [f"{s} has no KERNEL_STATUS entry" for s in P if s not in KERNEL_STATUS]
    problems += [f"{s} has no error limit" for s in P if s not in DEFAULT_ERROR_LIMITS]
    for mode, forward in (("normal", NORMAL_TRANSITIONS), ("black-box", BLACK_BOX_TRANSITIONS)):
        for state, targets in forward.items():
            if state not in WORK_STATES or state in targets or targets & EXCEPTION_STATES:
                problems.append(f"{mode}: {state} → {sorted(targets)} breaks the forward rules")
        reachable = _closure(P.NOT_STARTED, forward)
        unused = BLACK_BOX_UNUSED if forward is BLACK_BOX_TRANSITIONS else frozenset()
        if reachable | unused != set(P) or reachable & unused:
            problems.append(f"{mode}: reachable {sorted(reachable)} plus unused are not all states")
        for state in reachable - TERMINAL:
            if not _closure(state, forward) & TERMINAL:
                problems.append(f"{mode}: no terminal state is reachable from {state}")
        # Without ERROR's exits the graph must be acyclic: then every cycle passes through an
        # ERROR entered from a state it re-enters, which the error limits bound, so runs end.
        for state in P:
            after = _closure(state, forward, leave_error=False) - {P.ERROR}
            if any(state in rule_targets(s, forward) for s in after):
                problems.append(f"{mode}: {state} lies on a cycle that avoids ERROR")
    if problems:
        raise ValueError("kernel progress tables are inconsistent: " + "; ".join(problems))


_NORMAL_TARGETS = _targets_by_state(NORMAL_TRANSITIONS)
_BLACK_BOX_TARGETS = _targets_by_state(BLACK_BOX_TRANSITIONS)


@record
class ProgressStep:
    """One entry into a state: when, and why (the cause of a failure or abort)."""

    state: Progress
    entered_at: datetime
    cause: str | None
    message: str


class KernelProgress:
    """The progress machine of one kernel: checked moves, error counts, history."""

    def __init__(
        self,
        *,
        black_box: bool = False,
        error_limits: Mapping[Progress, int] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._black_box = black_box
        self._targets = _BLACK_BOX_TARGETS if black_box else _NORMAL_TARGETS
        # The defaults are shared (read-only); only overrides make a mapping of their own.
        self._limits = (
            DEFAULT_ERROR_LIMITS if not error_limits else merge_error_limits(error_limits)
        )
        self._clock = clock
        self._state = P.NOT_STARTED
        self._origin: Progress | None = None
        self._errors: dict[Progress, int] = {}
        self._history = [ProgressStep(P.NOT_STARTED, clock(), None, "")]

    @property
    def state(self) -> Progress:
        return self._state

    @property
    def origin(self) -> Progress | None:
        """The state the current ERROR came from; None outside ERROR."""
        return self._origin

    @property
    def errors(self) -> Mapping[Progress, int]:
        """Failures so far per state (states that never failed are absent)."""
        return MappingProxyType(dict(self._errors))

    @property
    def error_limits(self) -> Mapping[Progress, int]:
        return self._limits

    @property
    def black_box(self) -> bool:
        return self._black_box

    @property
    def history(self) -> tuple[ProgressStep, ...]:
        return tuple(self._history)

    @property
    def terminal(self) -> bool:
        return self._state in TERMINAL

    @property
    def last_cause(self) -> str | None:
        """The cause of the latest failure or abort, the one to report with REPORTED_FAILED."""
        return next((s.cause for s in reversed(self._history) if s.cause is not None), None)

    def advance(self, to: Progress) -> None:
        """Move to `to` if the rules allow it now; raise a ProgressError otherwise."""
        self._move(to, None, "")

    def fail(self, cause: str, message: str = "") -> None:
        """Enter ERROR from the current state, counting one failure of it."""
        self._move(P.ERROR, cause, message)

    def retry(self) -> None:
        """Go back from ERROR to the state it came from, unless that state is out of attempts."""
        if self._origin is None:
            why = f"retry() needs an ERROR to go back from; the kernel is in {self._state}"
            raise ProgressError(self._state, None, why)
        self._move(self._origin, None, "")

    def can_retry(self) -> bool:
        """Whether retry() would succeed now."""
        return self._origin is not None and self._refusal(self._origin) is None

    def abort(self, cause: str, message: str = "") -> None:
        """Give the kernel up as failed (ABORTED); the failure is reported next."""
        self._move(P.ABORTED, cause, message)

    def user_abort(self) -> None:
        """Start the abort the kernel's owner asked for (USER_REQUESTED_ABORT)."""
        self._move(P.USER_REQUESTED_ABORT, None, "")

    def abandon(self) -> None:
        """Stop without reporting (ABANDONED); only from ERROR or the abort states."""
        self._move(P.ABANDONED, None, "")

    def allowed_next(self) -> frozenset[Progress]:
        """Every state a move may enter now, error limits included."""
        return frozenset(s for s in P if self._refusal(s) is None)

    def stage_durations(self) -> Mapping[Progress, timedelta]:
        """Time spent in each visited state, summed over repeats; the current one up to now."""
        ends = [step.entered_at for step in self._history[1:]] + [self._clock()]
        spent: dict[Progress, timedelta] = {}
        for step, end in zip(self._history, ends, strict=True):
            spent[step.state] = spent.get(step.state, timedelta()) + (end - step.entered_at)
        return MappingProxyType(spent)

    def kernel_status(self) -> KernelStatus | None:
        """The kernel status to report for the current state (None: leave it unchanged)."""
        return KERNEL_STATUS[self._state]

    def _refusal(self, to: Progress) -> ProgressError | None:
        source = self._state
        if source in TERMINAL:
            return TerminalStateError(source, to)
        if source == P.ERROR:
            assert self._origin is not None  # set on every entry into ERROR
            if to == P.ERROR:
                return RepeatedErrorError(self._origin)
            if to != self._origin and to not in ERROR_EXITS:
                return ErrorOriginError(self._origin, to)
        elif to not in (allowed := self._targets[source]):
            return IllegalTransitionError(
                source, to, allowed, "black-box" if self._black_box else "normal"
            )
        if to != P.ERROR and self._errors.get(to, 0) >= self._limits[to]:
            return ErrorLimitExceededError(source, to, self._limits[to])
        return None

    def _move(self, to: Progress, cause: str | None, message: str) -> None:
        refusal = self._refusal(to)
        if refusal is not None:
            raise refusal
        entered_at = self._clock()  # before any change, so a failing clock changes nothing
        if to == P.ERROR:
            self._origin = self._state
            self._errors[self._state] = self._errors.get(self._state, 0) + 1
        else:
            self._origin = None
        self._state = to
        self._history.append(ProgressStep(to, entered_at, cause, message))
