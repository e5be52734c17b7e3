"""The handler kind of the deployment and route coordinators (spec document 1).

A serving handler acts on the deployments (or routes) in its target statuses and sorts them
into successes, failures and stale ones; it declares where each outcome takes them, and the
coordinator applies the moves, guarded by the status it read and checked against the table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import Enum
from typing import Any, ClassVar, Generic, TypeVar

from corral.domain.serving import ServingHandlerResult, ServingTransitions

S = TypeVar("S", bound=Enum)

Target = dict[str, Any]


class ServingHandler(ABC, Generic[S]):
    """Acts on the entities in its target statuses and reports what happened to each."""

    # The hints this handler's coordinator sets after a run of it that moved something.
    next_hints: ClassVar[frozenset[str]] = frozenset()
    # True: run even with no targets (ServiceDiscoverySync publishes an empty table too).
    runs_when_empty: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def name(cls) -> str:
        """The handler's name: its task, its metric label, the phase in events."""

    @property
    @abstractmethod
    def target_statuses(self) -> frozenset[S]:
        """Entities in these statuses are its targets."""

    @classmethod
    @abstractmethod
    def status_transitions(cls) -> ServingTransitions[S]:
        """Where success, failure and staleness take an entity."""

    @abstractmethod
    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        """Act on `targets` and sort them by outcome."""
