"""`corral bench store`: batched, guarded status updates of sessions and kernels with history."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from corral.bench._scratch import StatementCounter, scratch_database
from corral.domain.results import SchedulingResult, TransitionStatus
from corral.domain.session import NewSession
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.store.agents import NewAgent, insert_agents, read_ledger
from corral.store.placements import KernelPlacement, SessionPlacement, commit_placements
from corral.store.sessions import SessionRepository
from corral.store.status_changes import StatusChange
from corral.store.tables import users

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


@dataclass(frozen=True, slots=True)
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
        owner = UserId(uuid.uuid4())
        async with db.transaction() as conn:
            await conn.execute(
                users.insert(), [{"id": owner, "name": "bench", "role": "user", "created_at": now}]
            )
        agents = [AgentId(f"bench-{i:04d}") for i in range(100)]
        per_agent = -(-sessions // len(agents))
        await insert_agents(
            db,
            [NewAgent(a, f"10.0.0.{i}", {"cpu": per_agent * 1000}) for i, a in enumerate(agents)],
            now,
        )
        repo = SessionRepository(db)
        ids = [SessionId(uuid.uuid4()) for _ in range(sessions)]
        await repo.insert(
            [
                NewSession(
                    id=sid,
                    owner_id=owner,
                    type="BATCH",
                    resource_group="default",
                    cluster_mode="single-node",
                    cluster_size=1,
                    spec={"image": "python", "command": ["true"]},
                    kernel_slots={"cpu": 1000},
                )
                for sid in ids
            ],
            now,
        )
        plan = [
            SessionPlacement(sid, (KernelPlacement(0, agents[i % len(agents)], {"cpu": 1000}),))
            for i, sid in enumerate(ids)
        ]
        placed = await commit_placements(db, plan, now)
        assert len(placed.placed) == sessions, "bench setup: every session must be placed"

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
