"""Results and declared transitions of the deployment and route handlers (spec document 1).

Unlike the session handlers, these have no retry, expiry or give-up: a deployment handler's
attempt is a SUCCESS or a FAILURE, a route handler's also STALE (spec document 1's comparison
table). `None` for an outcome leaves the status as it is (the history still records it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, TypeVar

from corral.domain.record import record

S = TypeVar("S", bound=Enum)


class ServingResult(StrEnum):
    """How one attempt of a deployment or route handler on one entity went."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    STALE = "STALE"  # routes only: the health information is out of date


@record
class ServingTransitions(Generic[S]):
    """Where each outcome takes the entity; None keeps its status."""

    success: S | None = None
    failure: S | None = None
    stale: S | None = None

    def for_result(self, result: ServingResult) -> S | None:
        """The status `result` moves an entity to (None: no move)."""
        match result:
            case ServingResult.SUCCESS:
                return self.success
            case ServingResult.FAILURE:
                return self.failure
            case ServingResult.STALE:
                return self.stale


@dataclass
class ServingHandlerResult:
    """What a handler did with each target; a target in none of the lists is left alone.

    `notes` says why (a user reads it in events); `values` are columns written on the
    entity together with its outcome (a route's address, its probe counters), moved or not.
    """

    successes: list[uuid.UUID] = field(default_factory=list)
    failures: list[uuid.UUID] = field(default_factory=list)
    stale: list[uuid.UUID] = field(default_factory=list)
    notes: dict[uuid.UUID, str] = field(default_factory=dict)
    values: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    # Seconds until the handler has work again that nothing announces (a probe, a timeout).
    due_in_s: float | None = None

    def by_result(self) -> dict[ServingResult, list[uuid.UUID]]:
        """The targets per outcome."""
        return {
            ServingResult.SUCCESS: self.successes,
            ServingResult.FAILURE: self.failures,
            ServingResult.STALE: self.stale,
        }

    def due(self, seconds: float) -> None:
        """Remember that work comes due in `seconds` (the earliest such time wins)."""
        self.due_in_s = seconds if self.due_in_s is None else min(self.due_in_s, seconds)
