"""How a session whose kernels all ended ends: TERMINATED, ERROR or CANCELLED (DESIGN.md)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from corral.domain.outcome import TIME_LIMIT, USER_CANCELLED, SessionResult
from corral.domain.session import KernelState, SessionProgress
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.handlers.sessions.promotions import session_ending

K, S = KernelStatus, SessionStatus
NOW = datetime(2030, 1, 1, tzinfo=UTC)
SID = SessionId(uuid.uuid4())


def kernel(
    index: int,
    status: K,
    exit_code: int | None = None,
    cause: str | None = None,
    *,
    stopped: bool = False,
) -> KernelState:
    """Kernel `index` of one session (index 0 is the main kernel); `stopped`: the manager
    asked its agent to stop it."""
    return KernelState("main" if index == 0 else "sub", index, status, exit_code, cause, stopped)


def ended(*kernels: KernelState, started: bool = True) -> SessionProgress:
    """A TERMINATING session with these kernels."""
    return SessionProgress(SID, S.TERMINATING, NOW if started else None, kernels)


def test_the_main_kernels_exit_code_decides_the_result() -> None:
    """TERMINATED with the main kernel's exit code; success exactly when it is 0."""
    ok = session_ending(ended(kernel(1, K.TERMINATED, 9), kernel(0, K.TERMINATED, 0)))
    assert (ok.status, ok.result, ok.exit_code) == (S.TERMINATED, "success", 0)
    bad = session_ending(ended(kernel(0, K.TERMINATED, 2), kernel(1, K.TERMINATED, 0)))
    assert (bad.status, bad.result, bad.exit_code) == (S.TERMINATED, "failure", 2)


def test_a_main_kernel_stopped_because_a_rank_ended_first_does_not_decide() -> None:
    """Rank 1 ends by itself, the main kernel is stopped (-15): rank 1's exit decides."""
    cut = kernel(0, K.TERMINATED, -15, stopped=True)
    ok = session_ending(ended(cut, kernel(1, K.TERMINATED, 0)))
    assert (ok.status, ok.result, ok.exit_code) == (S.TERMINATED, "success", 0)
    # A rank that exits non-zero by itself is in ERROR (its agent says why): that decides.
    failed = kernel(2, K.ERROR, 3, "kernel_nonzero_exit")
    bad = session_ending(ended(cut, kernel(1, K.TERMINATED, 0), failed))
    assert (bad.status, bad.result, bad.exit_code) == (S.ERROR, "failure", 3)
    # Whatever a stopped main kernel exits with (a SIGTERM handler's own code), it was cut.
    handled = ended(kernel(0, K.TERMINATED, 4, stopped=True), kernel(1, K.TERMINATED, 0))
    assert (session_ending(handled).result, session_ending(handled).exit_code) == ("success", 0)
    # Every kernel stopped (nothing ended by itself): the main kernel's exit, as before.
    all_stopped = ended(cut, kernel(1, K.TERMINATED, -15, stopped=True))
    assert (session_ending(all_stopped).result, session_ending(all_stopped).exit_code) == (
        "failure",
        -15,
    )


def test_a_failed_kernel_makes_an_error_with_its_cause() -> None:
    """Any kernel in ERROR ends the session in ERROR, carrying that kernel's failure cause."""
    end = session_ending(ended(kernel(0, K.TERMINATED, 0), kernel(1, K.ERROR, cause="oom")))
    assert (end.status, end.result) == (S.ERROR, "failure")
    assert end.note is not None and end.note.code == "oom"
    unknown = session_ending(ended(kernel(0, K.ERROR)))
    assert unknown.note is not None and unknown.note.code == "kernel_failed"


def test_a_session_that_never_ran_is_cancelled() -> None:
    """No start and no exit code anywhere: CANCELLED; an exit code proves a kernel ran."""
    never = ended(kernel(0, K.CANCELLED), kernel(1, K.CANCELLED), started=False)
    assert session_ending(never).status is S.CANCELLED
    quick = ended(kernel(0, K.TERMINATED, 0), started=False)
    assert session_ending(quick).status is S.TERMINATED
    assert session_ending(dataclasses.replace(never, started_at=NOW)).status is S.TERMINATED


@pytest.mark.parametrize(
    ("cause", "result"),
    [(USER_CANCELLED, SessionResult.CANCELLED), (TIME_LIMIT, SessionResult.TIMEOUT)],
)
def test_an_end_asked_for_decides_the_result_of_a_session_that_ran(
    cause: str, result: SessionResult
) -> None:
    """A user's terminate or a time limit: TERMINATED with cancelled/timeout, whatever the exit."""
    for stopped in (kernel(0, K.TERMINATED, -15), kernel(0, K.TERMINATED, 0), kernel(0, K.ERROR)):
        end = session_ending(dataclasses.replace(ended(stopped), cause=cause))
        assert (end.status, end.result, end.note) == (S.TERMINATED, result, None)
    never = dataclasses.replace(ended(kernel(0, K.CANCELLED), started=False), cause=cause)
    assert (session_ending(never).status, session_ending(never).result) == (
        S.CANCELLED,
        SessionResult.CANCELLED,
    )
