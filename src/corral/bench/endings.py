"""`corral bench endings`: sessions ending among many that keep running.

A cluster's RUNNING sessions are long-lived and many; what ends is a trickle. The bench puts
`running` sessions in RUNNING (kernels RUNNING, placed on 100 agents), then ends `ending` of
them the way agents do, by reports of their kernels' TERMINATED in batches of `batch`, and
times until every one of them ended, with one of two ways of promoting:

- `report` (what the manager does): each committed batch promotes its sessions at once
  (`SessionCoordinator.promote_reported`);
- `tasks` (the promotion tasks, woken by the reports' hints): after each batch,
  DetectTermination over all RUNNING sessions, then PromoteToTerminated over all TERMINATING.

The others must still be RUNNING at the end, and the ended ones TERMINATED.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Literal

import sqlalchemy as sa

from corral.bench._scratch import scratch_database, seed_placed_sessions
from corral.controller.agents import after_reports
from corral.coordination.coordinator import SessionCoordinator
from corral.domain.record import record
from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, KernelId, SessionId
from corral.handlers.sessions.promotions import DetectTermination, PromoteToTerminated
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database
from corral.store.kernel_reports import KernelReport, ReportOutcome, apply_report_batches
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from corral.store.tables import kernels

S, K = SessionStatus, KernelStatus
Path = Literal["report", "tasks"]
# The moves that take a placed session to RUNNING, one guarded apply each.
_TO_RUNNING = (
    (S.SCHEDULED, S.PREPARING, K.PREPARING),
    (S.PREPARING, S.PREPARED, K.PREPARED),
    (S.PREPARED, S.CREATING, K.CREATING),
    (S.CREATING, S.RUNNING, K.RUNNING),
)


@record
class EndingsBenchResult:
    """Figures of one run."""

    backend: str
    path: Path
    running: int
    ending: int
    batch: int
    seconds: float

    def as_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "path": self.path,
            "running": self.running,
            "ending": self.ending,
            "batch": self.batch,
            "seconds": round(self.seconds, 3),
            "us_per_ending": round(self.seconds / self.ending * 1e6),
        }


async def run_endings_bench(
    database: str, *, running: int, ending: int, batch: int, path: Path
) -> EndingsBenchResult:
    """Seed `running` RUNNING sessions, end `ending` of them by reports, time the endings."""
    if not 0 < ending <= running:
        raise ValueError(f"ending: must be between 1 and running ({running}), got {ending}")
    if batch < 1:
        raise ValueError(f"batch: must be at least 1, got {batch}")
    async with scratch_database(database) as db:
        now = datetime.now(UTC)
        placed = await _seed_running(db, running, now)
        coordinator = SessionCoordinator(db, MemoryHintBus(), clock=lambda: now)
        ended = placed[:ending]
        started = time.perf_counter()
        for first in range(0, ending, batch):
            chunk = ended[first : first + batch]
            by_agent: dict[AgentId, list[KernelReport]] = {}
            for _, kernel, agent in chunk:
                by_agent.setdefault(agent, []).append(KernelReport(kernel, K.TERMINATED, 0))
            results = await apply_report_batches(db, list(by_agent.items()), now)
            outcomes = [r for r in results if isinstance(r, ReportOutcome)]
            assert len(outcomes) == len(results), "bench: a report batch was refused"
            if path == "report":
                await after_reports(coordinator.hints, outcomes, coordinator.promote_reported)
            else:
                await coordinator.run_promotion(DetectTermination())
                await coordinator.run_promotion(PromoteToTerminated())
        seconds = time.perf_counter() - started
        await _check(db, [sid for sid, _, _ in ended], [sid for sid, _, _ in placed[ending:]])
        return EndingsBenchResult(db.dialect, path, running, ending, batch, seconds)


async def _seed_running(
    db: Database, count: int, now: datetime
) -> list[tuple[SessionId, KernelId, AgentId]]:
    """`count` single-kernel sessions, RUNNING on `SEED_AGENTS` agents: (session, kernel,
    agent)."""
    ids = await seed_placed_sessions(db, count, now)
    repo = SessionRepository(db)
    for step, (before, after, kernel) in enumerate(_TO_RUNNING, start=1):
        change = StatusChange(
            ids,
            "bench",
            SchedulingResult.SUCCESS,
            frozenset({before}),
            TransitionStatus(after, kernel),
        )
        await repo.apply([change], now - timedelta(seconds=len(_TO_RUNNING) - step + 1))
    async with db.read() as conn:
        rows = (
            await conn.execute(sa.select(kernels.c.session_id, kernels.c.id, kernels.c.agent_id))
        ).all()
    by_session = {SessionId(r[0]): (KernelId(r[1]), AgentId(r[2])) for r in rows}
    return [(sid, *by_session[sid]) for sid in ids]


async def _check(db: Database, ended: Sequence[SessionId], still: Sequence[SessionId]) -> None:
    """Every ended session TERMINATED, every other one still RUNNING."""
    statuses = {s.id: s.status for s in await SessionRepository(db).get([*ended, *still])}
    wrong = [sid for sid in ended if statuses[sid] is not S.TERMINATED]
    wrong += [sid for sid in still if statuses[sid] is not S.RUNNING]
    assert not wrong, f"bench check: {len(wrong)} session(s) in the wrong status, e.g. {wrong[0]}"
