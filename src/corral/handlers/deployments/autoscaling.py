"""AutoscaleDeployment (beyond spec document 1's five; issue 38): a ready deployment with an
autoscaling policy gets the replica count its load asks for (READY → SCALING, then
ScalingDeployment adds or drains replicas).

The load is the requests in flight to its replicas, summed over the live proxies' reports.
The recommendation is ceil(in flight / target_inflight) within [min_replicas, max_replicas];
it is applied once it has pointed the same way (more, or fewer) for the policy's delay of that
direction, and then the most cautious count seen over the delay (the fewest added, the fewest
taken out), as Ray Serve and Knative do. With no live proxy the load is unknown: nothing
changes but a count outside the bounds, which is brought inside at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.deployment import DEPLOYMENT_AUTOSCALED, DEPLOYMENT_ENTITY, DeploymentSpec
from corral.domain.events import Event
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import EndpointLifecycle
from corral.domain.types import Clock
from corral.handlers.serving_base import ServingHandler, Target
from corral.infra.events import EventBus, publish_appended
from corral.store.database import Database
from corral.store.deployments import set_autoscale_state
from corral.store.events import append_events
from corral.store.proxy_reports import read_proxy_load

_E = EndpointLifecycle
# Autoscaled deployments are looked at this often (the proxies report every second).
AUTOSCALE_POLL_S = 1.0


class AutoscaleDeploymentHandler(ServingHandler[EndpointLifecycle]):
    """Success (to SCALING) for a ready deployment whose replica count the autoscaler changed;
    the others stay READY, their pending recommendation kept in their row."""

    next_hints: ClassVar[frozenset[str]] = frozenset({ServingHint.SCALE})

    def __init__(self, db: Database, events: EventBus | None, clock: Clock) -> None:
        self._db = db
        self._events = events
        self._notify = events.commit_channel if events is not None else None
        self._clock = clock

    @classmethod
    def name(cls) -> str:
        return "AutoscaleDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.READY})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=_E.SCALING, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        scaled = [t for t in targets if t["replica_spec"].get("autoscaling")]
        if not scaled:
            return result
        now = self._clock()
        async with self._db.read() as conn:
            load = await read_proxy_load(conn, now)
        announced: list[Event] = []
        for target in scaled:
            result.due(AUTOSCALE_POLL_S)
            inflight = load.of_deployment(target["id"]) if load.proxies else None
            step = _decide(target, inflight, now)
            if step is None:
                continue
            wanted, since, apply, note = step
            to = wanted if apply else target["desired_replicas"]
            async with self._db.transaction() as conn:
                written = await set_autoscale_state(
                    conn,
                    target["id"],
                    expected=target["desired_replicas"],
                    replicas=to,
                    wanted=None if apply else wanted,
                    since=None if apply else since,
                )
                if written and apply:
                    event = Event(
                        kind=DEPLOYMENT_AUTOSCALED,
                        entity_type=DEPLOYMENT_ENTITY,
                        entity_id=str(target["id"]),
                        owner_id=target["owner_id"],
                        payload={
                            "name": target["name"],
                            "from": target["desired_replicas"],
                            "to": to,
                            "inflight": inflight,
                            "reason": note,
                        },
                        created_at=now,
                    )
                    announced += await append_events(conn, [event], now, notify=self._notify)
            if written and apply:
                result.successes.append(target["id"])
                result.notes[target["id"]] = note
        await publish_appended(self._events, announced)
        return result


def _decide(
    target: Target, inflight: int | None, now: datetime
) -> tuple[int, datetime | None, bool, str] | None:
    """(replicas wanted, since when, apply now?, why) — or None: nothing to write."""
    policy = DeploymentSpec.model_validate(target["replica_spec"]).autoscaling
    assert policy is not None
    current: int = target["desired_replicas"]
    pending: int | None = target["autoscale_wanted"]
    since: datetime | None = target["autoscale_since"]
    if policy.bounded(current) != current:
        bounded = policy.bounded(current)
        return bounded, None, True, f"{current} replica(s) outside the bounds: {bounded}"
    if inflight is None:
        return None  # no proxy reports: the load is unknown
    wanted = policy.bounded(math.ceil(inflight / policy.target_inflight))
    if wanted == current:
        return None if pending is None else (current, None, False, "load as served")
    up = wanted > current
    if pending is None or since is None or (pending > current) != up:
        pending, since = wanted, now  # a new direction: its delay starts now
    else:
        pending = min(pending, wanted) if up else max(pending, wanted)
    delay = policy.upscale_delay_s if up else policy.downscale_delay_s
    said = (
        f"{inflight} request(s) in flight for {policy.target_inflight:g} per replica: "
        f"{current} → {pending} replica(s)"
    )
    if (now - since).total_seconds() >= delay:
        return pending, None, True, said
    if pending == target["autoscale_wanted"] and since == target["autoscale_since"]:
        return None  # as recorded: nothing to write
    return pending, since, False, said
