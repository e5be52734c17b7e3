"""The deployment and route coordinators: one task per handler, run by the same dual loops,
hints and locks as the session coordinator (DESIGN.md, "Coordination").

A run loads the handler's targets in one read, lets the handler act, then applies what it
reported in one transaction: each move guarded by the status the target was read in and
checked against the lifecycle table, the handler's values written, an event per move. The
handler's next hints are set after the commit.
"""

from __future__ import annotations

import time
import uuid
from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from enum import Enum
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.controller.sessions import SessionController
from corral.coordination.metrics import CoordinatorMetrics
from corral.coordination.serving_hints import ServingHint
from corral.coordination.tasks import Task, TaskRun
from corral.domain.deployment import (
    DEPLOYMENT_CHANGED,
    DEPLOYMENT_ENTITY,
    ROUTE_CHANGED,
    ROUTE_ENTITY,
)
from corral.domain.events import Event
from corral.domain.serving import ServingHandlerResult, ServingResult
from corral.domain.status import EndpointLifecycle, RouteStatus
from corral.domain.types import Clock, utcnow
from corral.handlers.deployments import (
    CheckPendingDeploymentHandler,
    CheckReplicaDeploymentHandler,
    DestroyingDeploymentHandler,
    ReconcileDeploymentHandler,
    ScalingDeploymentHandler,
)
from corral.handlers.deployments.autoscaling import AutoscaleDeploymentHandler
from corral.handlers.deployments.deploying import DeployingDeploymentHandler
from corral.handlers.routes.discovery import ServiceDiscoverySyncHandler
from corral.handlers.routes.eviction import RouteEvictionHandler
from corral.handlers.routes.health_check import HealthCheckRouteHandler
from corral.handlers.routes.provisioning import DEFAULT_START_TIMEOUT_S, ProvisioningRouteHandler
from corral.handlers.routes.running import RunningRouteHandler
from corral.handlers.routes.terminating import TerminatingRouteHandler
from corral.handlers.serving_base import ServingHandler, Target
from corral.infra.events import EventBus, publish_appended
from corral.infra.hints import HintBus
from corral.store.database import Database
from corral.store.deployments import (
    move_deployments,
    move_routes,
    read_deployments_in,
    read_route_targets,
    read_routes,
    routes_by_deployment,
    update_routes,
)
from corral.store.events import append_events
from corral.store.serving_history import (
    HistoryEntry,
    record_deployment_history,
    record_route_history,
)

__all__ = [
    "DEPLOYMENT_CHANGED",
    "DEPLOYMENT_ENTITY",
    "ROUTE_CHANGED",
    "ROUTE_ENTITY",
    "DeploymentCoordinator",
    "RouteCoordinator",
    "serving_coordinators",
]

S = TypeVar("S", bound=Enum)


class _ServingCoordinator(Generic[S]):
    """Runs serving handlers of one status enum: load, execute, apply, hint."""

    entity: str
    event_kind: str
    status_key: str

    def __init__(
        self,
        db: Database,
        hints: HintBus,
        events: EventBus | None,
        handlers: Sequence[tuple[ServingHandler[S], str]],
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.hints = hints
        self.events = events
        self.clock = clock
        self.handlers = tuple(handlers)
        self._notify = events.commit_channel if events is not None else None

    def tasks(self) -> list[Task]:
        """One task per handler, woken by the handler's hint, under a lock of its own."""
        tasks = []
        for handler, hint in self.handlers:
            name = f"{self.entity}-{handler.name()}"

            async def run(handler: ServingHandler[S] = handler, name: str = name) -> TaskRun:
                return await self.run(handler, name)

            tasks.append(Task(name=name, hint=hint, run=run, lock=f"corral:{name}"))
        return tasks

    async def run(self, handler: ServingHandler[S], task: str | None = None) -> TaskRun:
        """One run of `handler`: what it looked at and moved."""
        started = time.perf_counter()
        task = task or handler.name()
        async with self.db.read() as conn:
            targets = await self._load(conn, handler.target_statuses)
        if not targets and not handler.runs_when_empty:
            return TaskRun(task=task)
        result = await handler.execute(targets)
        changed = await self._apply(handler, targets, result)
        if changed or result.successes or result.failures or result.stale:
            await self.hints.set_after_commit(*handler.next_hints)
        return TaskRun(
            task=task,
            targets=len(targets),
            changed=changed,
            duration_ms=(time.perf_counter() - started) * 1000,
            due_in_s=result.due_in_s,
        )

    async def _apply(
        self, handler: ServingHandler[S], targets: Sequence[Target], result: ServingHandlerResult
    ) -> int:
        transitions = handler.status_transitions()
        by_id = {t["id"]: t for t in targets}
        now = self.clock()
        changes: list[Event] = []
        async with self.db.transaction() as conn:
            if result.values:
                await self._write_values(conn, result.values)
            for outcome, ids in result.by_result().items():
                if not ids:
                    continue
                target_status = transitions.for_result(outcome)
                by_source: dict[S, list[uuid.UUID]] = {}
                history: list[HistoryEntry] = []
                for entity_id in ids:
                    source = self._status(by_id[entity_id])
                    if target_status is not None and source != target_status:
                        by_source.setdefault(source, []).append(entity_id)
                    else:
                        history.append(self._history(by_id[entity_id], source, None, result))
                for source, group in by_source.items():
                    assert target_status is not None
                    moved = await self._move(conn, group, {source}, target_status, now)
                    changes.extend(
                        self._event(by_id[m], source, target_status, handler, outcome, result, now)
                        for m in moved
                    )
                    # One moved by another manager meanwhile is that manager's to record.
                    history += [
                        self._history(by_id[m], source, target_status, result) for m in moved
                    ]
                await self._record_history(conn, history, handler.name(), outcome.value, now)
            appended = await append_events(conn, changes, now, notify=self._notify)
        await publish_appended(self.events, appended)
        return len(changes)

    def _event(
        self,
        target: Mapping[str, Any],
        source: S,
        to: S,
        handler: ServingHandler[S],
        outcome: ServingResult,
        result: ServingHandlerResult,
        now: Any,
    ) -> Event:
        payload: dict[str, Any] = {
            "from": source.value,
            "to": to.value,
            "phase": handler.name(),
            "result": outcome.value,
            **self._event_fields(target),
        }
        note = result.notes.get(target["id"])
        if note:
            payload["reason"] = note
        return Event(
            kind=self.event_kind,
            entity_type=self.entity,
            entity_id=str(target["id"]),
            owner_id=target["owner_id"],
            payload=payload,
            created_at=now,
        )

    def _event_fields(self, target: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def _history(
        self, target: Mapping[str, Any], source: S, to: S | None, result: ServingHandlerResult
    ) -> HistoryEntry:
        return HistoryEntry(
            entity_id=target["id"],
            from_status=source.value,
            to_status=None if to is None else to.value,
            message=result.notes.get(target["id"], ""),
            deployment_id=target.get("deployment_id"),
        )

    @abstractmethod
    async def _record_history(
        self,
        conn: AsyncConnection,
        entries: Sequence[HistoryEntry],
        phase: str,
        result: str,
        now: Any,
    ) -> None: ...

    @abstractmethod
    def _status(self, target: Mapping[str, Any]) -> S: ...

    @abstractmethod
    async def _load(self, conn: AsyncConnection, statuses: frozenset[S]) -> list[Target]: ...

    @abstractmethod
    async def _move(
        self,
        conn: AsyncConnection,
        ids: Collection[uuid.UUID],
        sources: Collection[S],
        target: S,
        now: Any,
    ) -> list[uuid.UUID]: ...

    async def _write_values(
        self, conn: AsyncConnection, values: Mapping[uuid.UUID, Mapping[str, Any]]
    ) -> None:
        # Deployment handlers return no values (routes carry the probe counters): one that did
        # is a bug, said at once rather than dropped.
        raise TypeError(f"{self.entity} handlers return no values to write; got {len(values)}")


class DeploymentCoordinator(_ServingCoordinator[EndpointLifecycle]):
    """The five deployment handlers; a target is a deployment row with its `routes`."""

    entity = DEPLOYMENT_ENTITY
    event_kind = DEPLOYMENT_CHANGED

    def _status(self, target: Mapping[str, Any]) -> EndpointLifecycle:
        return EndpointLifecycle(target["lifecycle"])

    def _event_fields(self, target: Mapping[str, Any]) -> dict[str, Any]:
        return {"name": target["name"]}

    async def _load(
        self, conn: AsyncConnection, statuses: frozenset[EndpointLifecycle]
    ) -> list[Target]:
        found = await read_deployments_in(conn, statuses)
        if not found:
            return []
        grouped = routes_by_deployment(
            await read_routes(conn, deployment_ids=[d["id"] for d in found])
        )
        return [{**d, "routes": grouped.get(d["id"], [])} for d in found]

    async def _move(
        self,
        conn: AsyncConnection,
        ids: Collection[uuid.UUID],
        sources: Collection[EndpointLifecycle],
        target: EndpointLifecycle,
        now: Any,
    ) -> list[uuid.UUID]:
        return await move_deployments(conn, ids, sources, target, now)

    async def _record_history(
        self,
        conn: AsyncConnection,
        entries: Sequence[HistoryEntry],
        phase: str,
        result: str,
        now: Any,
    ) -> None:
        await record_deployment_history(conn, entries, phase=phase, result=result, now=now)


class RouteCoordinator(_ServingCoordinator[RouteStatus]):
    """The six route handlers; a target is a route row with its session's status, its main
    kernel's runtime info and its deployment's spec and owner."""

    entity = ROUTE_ENTITY
    event_kind = ROUTE_CHANGED

    def _status(self, target: Mapping[str, Any]) -> RouteStatus:
        return RouteStatus(target["status"])

    def _event_fields(self, target: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "deployment_id": str(target["deployment_id"]),
            "deployment": target["deployment_name"],
        }

    async def _load(self, conn: AsyncConnection, statuses: frozenset[RouteStatus]) -> list[Target]:
        return await read_route_targets(conn, statuses)

    async def _move(
        self,
        conn: AsyncConnection,
        ids: Collection[uuid.UUID],
        sources: Collection[RouteStatus],
        target: RouteStatus,
        now: Any,
    ) -> list[uuid.UUID]:
        return await move_routes(conn, ids, sources, target, now)

    async def _record_history(
        self,
        conn: AsyncConnection,
        entries: Sequence[HistoryEntry],
        phase: str,
        result: str,
        now: Any,
    ) -> None:
        await record_route_history(conn, entries, phase=phase, result=result, now=now)

    async def _write_values(
        self, conn: AsyncConnection, values: Mapping[uuid.UUID, Mapping[str, Any]]
    ) -> None:
        await update_routes(conn, values)


def serving_coordinators(
    db: Database,
    hints: HintBus,
    events: EventBus | None,
    sessions: SessionController,
    *,
    clock: Clock = utcnow,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    metrics: CoordinatorMetrics | None = None,
) -> tuple[DeploymentCoordinator, RouteCoordinator]:
    """The deployment coordinator (five handlers) and the route coordinator (its handlers),
    each handler with its hint; failed health probes counted in `metrics`."""
    deployments = DeploymentCoordinator(
        db,
        hints,
        events,
        [
            (CheckPendingDeploymentHandler(), ServingHint.CHECK_PENDING),
            (ScalingDeploymentHandler(db, sessions, events), ServingHint.SCALE),
            (CheckReplicaDeploymentHandler(), ServingHint.CHECK_REPLICAS),
            (ReconcileDeploymentHandler(), ServingHint.RECONCILE),
            (DestroyingDeploymentHandler(db, events, clock), ServingHint.DESTROY),
            (DeployingDeploymentHandler(db, sessions, events), ServingHint.DEPLOY),
            (AutoscaleDeploymentHandler(db, events, clock), ServingHint.AUTOSCALE),
        ],
        clock=clock,
    )
    routes = RouteCoordinator(
        db,
        hints,
        events,
        [
            (ProvisioningRouteHandler(clock, start_timeout_s), ServingHint.PROVISION_ROUTES),
            (
                HealthCheckRouteHandler(
                    clock, None if metrics is None else metrics.observe_probe_failures
                ),
                ServingHint.CHECK_HEALTH,
            ),
            (RunningRouteHandler(), ServingHint.CHECK_RUNNING_ROUTES),
            (RouteEvictionHandler(), ServingHint.EVICT_ROUTES),
            (TerminatingRouteHandler(sessions, db, clock), ServingHint.TERMINATE_ROUTES),
            (ServiceDiscoverySyncHandler(db, events, clock), ServingHint.SYNC_DISCOVERY),
        ],
        clock=clock,
    )
    return deployments, routes
