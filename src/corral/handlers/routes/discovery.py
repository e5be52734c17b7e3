"""ServiceDiscoverySync: publish the healthy route table when it changes (a replica in or out,
a deployment's access or token): an event (whose id is the table's revision) that proxies
follow, and the table they read (`/v1/serving/routes`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import ClassVar

from corral.domain.deployment import ROUTE_TABLE_CHANGED, ROUTE_TABLE_ENTITY, ROUTE_TABLE_ID
from corral.domain.events import Event
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import RouteStatus
from corral.domain.types import Clock
from corral.handlers.serving_base import ServingHandler, Target
from corral.infra.events import EventBus, publish_appended
from corral.store.database import Database
from corral.store.events import append_events


class ServiceDiscoverySyncHandler(ServingHandler[RouteStatus]):
    """Moves nothing; appends a route-table event when the healthy routes differ from those it
    published last (a manager that restarts publishes once more: harmless)."""

    runs_when_empty: ClassVar[bool] = True

    def __init__(self, db: Database, events: EventBus | None, clock: Clock) -> None:
        self._db = db
        self._events = events
        self._clock = clock
        self._published: str | None = None  # the digest of the table published last

    @classmethod
    def name(cls) -> str:
        return "ServiceDiscoverySync"

    @property
    def target_statuses(self) -> frozenset[RouteStatus]:
        return frozenset({RouteStatus.HEALTHY})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[RouteStatus]:
        return ServingTransitions(success=None, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        # Who may pass is part of the table: a rotated token or changed access is published.
        table = sorted(
            f"{t['deployment_id']} {t['host']}:{t['port']} {t['access']} {t['token_hash']}"
            for t in targets
        )
        digest = hashlib.sha256("\n".join(table).encode()).hexdigest()[:16]
        if digest != self._published:
            now = self._clock()
            event = Event(
                kind=ROUTE_TABLE_CHANGED,
                entity_type=ROUTE_TABLE_ENTITY,
                entity_id=ROUTE_TABLE_ID,
                payload={"digest": digest, "healthy_routes": len(table)},
                created_at=now,
            )
            notify = self._events.commit_channel if self._events is not None else None
            async with self._db.transaction() as conn:
                appended = await append_events(conn, [event], now, notify=notify)
            await publish_appended(self._events, appended)
            self._published = digest
        return ServingHandlerResult(successes=[t["id"] for t in targets])
