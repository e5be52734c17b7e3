"""Which tasks wake after a move: the chain of hints from submit to the end."""

from __future__ import annotations

from typing import cast

from corral.coordination.coordinator import RETRY_BATCH_S, SessionCoordinator
from corral.coordination.hints import Hint, hints_after_moves, hints_after_report
from corral.coordination.manager import LoopIntervals, task_loops
from corral.coordination.serving_hints import ServingHint
from corral.domain.status import KernelStatus, SessionStatus
from corral.handlers.sessions.retries import DispatchRetries
from corral.infra.hints import HintBus
from corral.infra.hints.memory import MemoryHintBus
from corral.infra.locks import LockManager
from corral.store.database import Database

K, S = KernelStatus, SessionStatus


def test_every_coordinator_task_has_its_own_hint_and_lock() -> None:
    """One task per handler; a hint or lock shared by two would merge their wake-ups."""
    coordinator = SessionCoordinator(cast(Database, None), cast(HintBus, None))
    tasks = coordinator.tasks()
    # spec document 1's eight, DetectFailureBeforeRunning, EnforceTimeLimits, DispatchRetries,
    # EvictNotReady
    assert len(tasks) == 12
    assert len({t.hint for t in tasks}) == 12
    assert len({t.lock for t in tasks}) == 12
    assert {t.hint for t in tasks} == {h.value for h in Hint} - {Hint.ASSIGNMENTS.value}


def test_promotions_are_quick_tasks_and_debounce_less() -> None:
    """A promotion's run is a few statements: it waits the quick debounce, the others longer;
    the retry task, whose work waits its delay anyway, gathers a burst longest."""
    coordinator = SessionCoordinator(cast(Database, None), cast(HintBus, None))
    intervals = LoopIntervals(debounce_s=0.005, quick_debounce_s=0.001)
    loops = task_loops(coordinator.tasks(), MemoryHintBus(), cast(LockManager, None), intervals)
    quick = {loop.task.name for loop in loops if loop.debounce_s == 0.001}
    assert quick == {h.name() for h in coordinator.promotions}
    patient = {loop.task.name: loop.debounce_s for loop in loops if loop.debounce_s > 0.005}
    assert patient == {DispatchRetries.name(): RETRY_BATCH_S}
    assert {loop.debounce_s for loop in loops if loop.task.name not in quick | set(patient)} == {
        0.005
    }


def test_each_session_move_wakes_the_next_phase() -> None:
    """SCHEDULED wakes preparation, PREPARED the start, TERMINATING the stop, ends the scheduler."""
    assert hints_after_moves([S.SCHEDULED]) == {Hint.PREPARE}
    assert hints_after_moves([S.PREPARED]) == {Hint.START}
    assert hints_after_moves([S.TERMINATING]) == {Hint.TERMINATE, Hint.PROMOTE_TERMINATED}
    assert Hint.SCHEDULE in hints_after_moves([S.PENDING])
    for end in (S.TERMINATED, S.CANCELLED, S.ERROR):
        assert Hint.SCHEDULE in hints_after_moves([end])
    assert Hint.ASSIGNMENTS in hints_after_moves([S.PREPARING])


def test_entering_a_status_wakes_the_promotion_its_kernels_may_already_satisfy() -> None:
    """Kernels can move on before their session: entering a status re-checks them at once."""
    assert Hint.PROMOTE_TERMINATED in hints_after_moves([S.TERMINATING])
    # Entering RUNNING: DetectTermination only if a kernel already ended (the coordinator looks;
    # test_promotion); the time limits, whose next deadline may be the session's.
    assert hints_after_moves([S.RUNNING]) == {Hint.TIME_LIMIT, ServingHint.PROVISION_ROUTES}


def test_entering_a_stage_wakes_no_promotion_the_agents_reports_will_wake() -> None:
    """The move into PREPARING or CREATING asks the agents for the stage (in one write): no
    report of the stage can precede it, so only the reports wake the stage's promotion."""
    assert hints_after_moves([S.PREPARING]) == {Hint.ASSIGNMENTS}
    assert hints_after_moves([S.CREATING]) == {Hint.ASSIGNMENTS}


def test_each_kernel_report_wakes_the_promotion_that_waits_for_it() -> None:
    """Agents' reports wake the promotion handlers; a failed stage wakes the handler to retry."""
    assert hints_after_report([K.PREPARED]) == {Hint.PROMOTE_PREPARED}
    assert hints_after_report([K.RUNNING]) == {Hint.PROMOTE_RUNNING}
    assert hints_after_report([K.TERMINATED]) == {
        Hint.DETECT_TERMINATION,
        Hint.PROMOTE_TERMINATED,
    }
    assert Hint.DETECT_FAILURE in hints_after_report([K.ERROR])
    assert hints_after_report([], [K.PULLING]) == {Hint.PREPARE}
    assert hints_after_report([], [K.CREATING]) == {Hint.START}
