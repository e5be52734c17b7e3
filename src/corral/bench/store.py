"""`corral bench store`: batched, guarded status updates of sessions and kernels with history."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from corral.bench._scratch import StatementCounter, scratch_database, seed_placed_sessions
from corral.domain.record import record
from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.status import KernelStatus, SessionStatus
from corral.store.agents import read_ledger
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange

S, K, R = SessionStatus, KernelStatus, SchedulingResult

# The phases timed, in order: each is one `apply` over every session of the batch.
PHASES = (
    StatusChange(
        (),
        "PrepareSessions",
        R.SUCCESS,
        frozenset({S.SCHEDULED}),
        TransitionStatus(S.PREPARING, K.PREPARING),
    ),
    StatusChange(
        (), "terminate", R.SUCCESS, frozenset({S.PREPARING}), TransitionStatus(S.TERMINATING)
    ),
    StatusChange(
        (),
        "TerminateSessions",
        R.SUCCESS,
        frozenset({S.TERMINATING}),
        TransitionStatus(S.TERMINATED, K.TERMINATED),
    ),
)


@record
class StoreBenchResult:
    """Figures of one run on one backend."""

    backend: str
    sessions: int
    status_updates: int
    seconds: float
    statements: int
    phase_ms: dict[str, float]

    def as_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "sessions": self.sessions,
            "kernels": self.sessions,
            "status_updates": self.status_updates,
            "status_updates_per_s": round(self.status_updates / self.seconds),
            "seconds": round(self.seconds, 4),
            "statements": self.statements,
            "phase_ms": {k: round(v, 1) for k, v in self.phase_ms.items()},
        }


async def run_store_bench(database: str, sessions: int) -> StoreBenchResult:
    """Create `sessions` single-kernel sessions, place them, then time three guarded phases."""
    async with scratch_database(database) as db:
        now = datetime.now(UTC)
        ids = await seed_placed_sessions(db, sessions, now)
        repo = SessionRepository(db)

        counter = StatementCounter(db)
        phase_ms: dict[str, float] = {}
        updates = 0
        started = time.perf_counter()
        for step, template in enumerate(PHASES):
            change = StatusChange(
                ids, template.phase, template.result, template.expected, template.target
            )
            t0 = time.perf_counter()
            applied = await repo.apply([change], now + timedelta(seconds=step + 1))
            phase_ms[template.phase] = (time.perf_counter() - t0) * 1000
            updates += len(applied.moved()) + applied.kernels_moved
        seconds = time.perf_counter() - started

        ledger = await read_ledger(db)
        leaked = sum(slots["cpu"][1] for slots in ledger.values())
        assert leaked == 0, f"bench check: {leaked} milli-cpu still occupied after termination"
        return StoreBenchResult(db.dialect, sessions, updates, seconds, counter.count, phase_ms)
