"""A manager and test agents on one database: submit, run the handlers, let agents answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from corral.controller.sessions import SessionController
from corral.coordination.coordinator import SessionCoordinator
from corral.domain.session import MilliSlots, SessionWithKernels
from corral.domain.spec import SessionSpec
from corral.domain.status import SessionStatus
from corral.domain.types import AgentId, SessionId, UserId
from corral.infra.events.memory import MemoryEventBus
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database
from corral.store.sessions import SessionRepository
from corral.store.tables import session_history
from corral.testing.agent import TestAgent
from tests.integration.store._factories import NOW, add_agents, add_user

S = SessionStatus
# The statuses a session that runs and ends well passes, in order.
LIFECYCLE = (
    S.PENDING,
    S.SCHEDULED,
    S.PREPARING,
    S.PREPARED,
    S.CREATING,
    S.RUNNING,
    S.TERMINATING,
    S.TERMINATED,
)


@dataclass
class Clock:
    """Injected time: starts at the factories' NOW, moves only when told."""

    now: datetime = NOW

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Cluster:
    """One manager's controller and coordinator, instant test agents, all on `db`."""

    db: Database
    owner: UserId
    agents: dict[AgentId, MilliSlots]
    clock: Clock
    hints: MemoryHintBus
    events: MemoryEventBus
    controller: SessionController
    coordinator: SessionCoordinator
    agent: TestAgent
    moves: list[int] = field(default_factory=list)

    async def submit(self, **fields: object) -> SessionId:
        """Enqueue a small batch session (`fields` on top of the defaults); its id."""
        spec = SessionSpec.model_validate(
            {"image": "python", "command": ["true"], "resources": {"cpu": "1"}, **fields}
        )
        return (await self.controller.enqueue(spec, self.owner)).session_id

    async def settle(self, max_rounds: int = 40) -> None:
        """Run every handler and let the agents answer until nothing moves any more."""
        for _ in range(max_rounds):
            moved = await self.coordinator.run_all()
            reported = await self.agent.step()
            self.moves.append(moved + reported)
            if not moved and not reported:
                return
        raise AssertionError(f"still moving after {max_rounds} rounds: {self.moves[-5:]}")

    async def session(self, sid: SessionId) -> SessionWithKernels:
        (found,) = await SessionRepository(self.db).get([sid])
        return found

    async def status(self, sid: SessionId) -> SessionStatus:
        return (await self.session(sid)).status

    async def run(self, name: str) -> int:
        """Run one task by handler name; the sessions it moved."""
        (task,) = [t for t in self.coordinator.tasks() if t.name == name]
        return (await task.run()).changed

    async def moves_of(self, sid: SessionId) -> list[tuple[str, str | None, str | None, int]]:
        """The session's history: (phase, result, to_status, attempts), oldest first."""
        h = session_history.c
        async with self.db.read() as conn:
            rows = await conn.execute(
                sa.select(h.phase, h.result, h.to_status, h.attempts)
                .where(h.session_id == sid)
                .order_by(h.id)
            )
            return [tuple(row) for row in rows]  # type: ignore[misc]


async def make_cluster(
    db: Database,
    capacities: Sequence[Mapping[str, int]],
    *,
    continue_stages: bool = True,
    **agent_knobs: object,
) -> Cluster:
    """A cluster with agents of these capacities (milli-units) and a fresh owner.

    With `continue_stages` False, every hop is its task's own run: a placed session waits in
    SCHEDULED for PrepareSessions, a prepared one in PREPARED for StartSessions.
    """
    clock = Clock()
    hints, events = MemoryHintBus(), MemoryEventBus("test")
    agents = await add_agents(db, [dict(c) for c in capacities])
    return Cluster(
        db=db,
        owner=await add_user(db),
        agents=agents,
        clock=clock,
        hints=hints,
        events=events,
        controller=SessionController(db, hints, events, clock=clock),
        coordinator=SessionCoordinator(
            db, hints, events, clock=clock, continue_stages=continue_stages
        ),
        agent=TestAgent(db, list(agents), hints=hints, clock=clock, **agent_knobs),
    )


def utc(seconds: float) -> datetime:
    """NOW plus `seconds`."""
    return NOW + timedelta(seconds=seconds)


__all__ = ["LIFECYCLE", "UTC", "Clock", "Cluster", "make_cluster"]
