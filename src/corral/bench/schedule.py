"""`corral bench schedule`: place N pending sessions on A agents, end to end, on one backend."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime

import sqlalchemy as sa

from corral.bench._scratch import scratch_database
from corral.coordination.coordinator import SessionCoordinator
from corral.domain.record import record
from corral.domain.session import NewSession
from corral.domain.types import AgentId, UserId, new_session_id
from corral.infra.hints.memory import MemoryHintBus
from corral.scheduler.scheduler import schedule_group
from corral.store.agents import NewAgent, insert_agents, read_ledger
from corral.store.resource_group_store import update_group
from corral.store.sessions import SessionRepository
from corral.store.tables import users

GIB_MILLI = 1024**3 * 1000
OWNERS = 50


@record
class ScheduleBenchResult:
    """Figures of one run on one backend."""

    backend: str
    agents: int
    sessions: int
    cluster_size: int
    placed: int
    seconds: float
    load_ms: float
    placement_ms: float
    commit_ms: float
    # The coordinator's ScheduleNewSessions run after that pass, over what is left: what every
    # pass costs while the queue outlasts the cluster (zero when everything was placed).
    next_pass_ms: float
    next_pass_targets: int

    def as_json(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "agents": self.agents,
            "sessions": self.sessions,
            "cluster_size": self.cluster_size,
            "placed": self.placed,
            "sessions_per_s": round(self.placed / self.seconds),
            "seconds": round(self.seconds, 4),
            "load_ms": round(self.load_ms, 1),
            "placement_ms": round(self.placement_ms, 1),
            "commit_ms": round(self.commit_ms, 1),
            "next_pass_ms": round(self.next_pass_ms, 1),
            "next_pass_targets": self.next_pass_targets,
        }


async def run_schedule_bench(
    database: str, *, agents: int, sessions: int, cluster_size: int, seed: int = 1
) -> ScheduleBenchResult:
    """Create agents and pending sessions (not timed), then time one pass: load, place, commit;
    then the coordinator's next ScheduleNewSessions run over what is left, if anything is.

    Agents have 64 cpu and 256 GiB per kernel of cluster size; sessions ask 1 to 4 cpu and 1 to
    8 GiB per kernel, from 50 owners at priorities 0 to 2 (the group lets users give up to 2),
    so the cluster holds them all and every session can be placed. Multi-node when
    `cluster_size` > 1.
    """
    rng = random.Random(seed)
    now = datetime.now(UTC)
    async with scratch_database(database) as db:
        owners = [UserId(uuid.uuid4()) for _ in range(OWNERS)]
        await update_group(db, "default", now, options_patch={"max_user_priority": 2})
        async with db.transaction() as conn:
            await conn.execute(
                users.insert(),
                [
                    {"id": o, "name": f"owner-{i}", "role": "user", "created_at": now}
                    for i, o in enumerate(owners)
                ],
            )
        await insert_agents(
            db,
            [
                NewAgent(AgentId(f"node-{i:05d}"), f"10.{i // 250}.{i % 250}.1",
                         {"cpu": 64_000 * cluster_size, "mem": 256 * GIB_MILLI * cluster_size})
                for i in range(agents)
            ],
            now,
        )  # fmt: skip
        await SessionRepository(db).insert(
            [
                NewSession(
                    id=new_session_id(),
                    owner_id=rng.choice(owners),
                    type="BATCH",
                    resource_group="default",
                    cluster_mode="multi-node" if cluster_size > 1 else "single-node",
                    cluster_size=cluster_size,
                    spec={"image": "python", "command": ["true"]},
                    kernel_slots={
                        "cpu": rng.randint(1, 4) * 1000,
                        "mem": rng.randint(1, 8) * GIB_MILLI,
                    },
                    priority=rng.randint(0, 2),
                )
                for _ in range(sessions)
            ],
            now,
        )
        async with db.read() as conn:  # warm the connection pool and statement caches
            await conn.execute(sa.select(users.c.id).limit(1))

        started = time.perf_counter()
        result = await schedule_group(db, "default", now)
        seconds = time.perf_counter() - started

        coordinator = SessionCoordinator(db, MemoryHintBus(), clock=lambda: now)
        started = time.perf_counter()
        run = await coordinator.run_lifecycle(coordinator.lifecycle[0])
        next_pass_ms = (time.perf_counter() - started) * 1000 if run.targets else 0.0

        ledger = await read_ledger(db)
        over = [a for a, slots in ledger.items() if any(o > c for c, o in slots.values())]
        assert not over, f"bench check: agents over capacity: {over[:5]}"
        return ScheduleBenchResult(
            backend=db.dialect,
            agents=agents,
            sessions=sessions,
            cluster_size=cluster_size,
            placed=len(result.committed.placed),
            seconds=seconds,
            load_ms=result.load_ms,
            placement_ms=result.placement_ms,
            commit_ms=result.commit_ms,
            next_pass_ms=next_pass_ms,
            next_pass_targets=run.targets,
        )
