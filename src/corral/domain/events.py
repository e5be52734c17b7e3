"""Events: the append-only audit log of every change, also fanned out live to subscribers."""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import field
from datetime import date, datetime
from typing import Any

from corral.domain.record import record

EntityType = str  # "session", "kernel", "agent", "deployment", "route" (and "bus" for markers)
SESSION_ENTITY: EntityType = "session"  # a session's events carry its id as entity_id

# Session event kinds written by more than one module (the submission and the retry task).
SESSION_CREATED = "session.created"
# A failed session's retry was created (cause, attempt, delay), or it failed with none left.
SESSION_RETRY_SCHEDULED = "session.retry_scheduled"
SESSION_RETRY_EXHAUSTED = "session.retry_exhausted"
# All-or-nothing admission (spec document 2): evicted for not being ready in time, then
# requeued (count, time) or deactivated (why); put back in the queue by its owner or an admin.
SESSION_EVICTED = "session.evicted"
SESSION_REQUEUED = "session.requeued"
SESSION_DEACTIVATED = "session.deactivated"
SESSION_ACTIVATED = "session.activated"
# A kernel of a running session went down to be restarted (KernelsReady false,
# WaitForRecovery), or every restarting kernel runs again (true, Recovered): the kernel
# restart policy (issue 36).
SESSION_KERNEL_RESTARTING = "session.kernel_restarting"
SESSION_RECOVERED = "session.recovered"

# Marker a bus yields in place of events it could not deliver (see corral.infra.events).
DROPPED_KIND = "events.dropped"


@record(kw_only=True)
class Event:
    """One change to one entity: `kind` (e.g. "session.status_changed") and a JSON payload.

    `id` is None until the event is appended to the events table; ids then grow with each
    append, so `read_events(after_id=...)` pages through the log.
    """

    id: int | None = None
    kind: str
    entity_type: EntityType
    entity_id: str
    owner_id: uuid.UUID | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    created_at: datetime

    def __post_init__(self) -> None:
        if self.created_at.tzinfo is None:
            raise ValueError(f"event {self.kind!r} needs a timezone-aware created_at")

    def to_json(self) -> str:
        """Compact JSON text of the event; datetimes, UUIDs and enums in the payload as text."""
        return json.dumps(
            {
                "id": self.id,
                "kind": self.kind,
                "entity_type": self.entity_type,
                "entity_id": self.entity_id,
                "owner_id": None if self.owner_id is None else str(self.owner_id),
                "payload": self.payload,
                "created_at": self.created_at.isoformat(),
            },
            separators=(",", ":"),
            default=_json_default,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Event:
        """The event `to_json` encoded (payload values come back as plain JSON values)."""
        return cls.from_data(json.loads(text))

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Event:
        """The event whose `to_json` text decodes to `data`."""
        owner = data.get("owner_id")
        return cls(
            id=data.get("id"),
            kind=data["kind"],
            entity_type=data["entity_type"],
            entity_id=data["entity_id"],
            owner_id=None if owner is None else uuid.UUID(owner),
            payload=data.get("payload") or {},
            created_at=datetime.fromisoformat(data["created_at"]),
        )


# Values JSON keeps as they are (exact types: an enum that is also a str is converted).
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def jsonable_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """`payload` as plain JSON values: what reading it back from the events table gives.

    A flat payload of plain values (every status change's) is only copied; anything else
    goes through JSON and back.
    """
    if all(type(k) is str and type(v) in _PLAIN_TYPES for k, v in payload.items()):
        return dict(payload)
    result: dict[str, Any] = json.loads(json.dumps(payload, default=_json_default))
    return result


def _json_default(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"event payload value {value!r} ({type(value).__name__}) is not JSON-able")
