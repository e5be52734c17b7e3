"""Transition tables: the law every status write in corral is checked against.

A table lists the allowed edges of one status enum, each with the rule that admits it. Handlers
declare their own transitions; a test checks every declaration against these tables, and the
store refuses any write the table does not allow before anything reaches the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Generic, TypeVar

from corral.domain.record import record

S = TypeVar("S", bound=Enum)


class IllegalTransitionError(ValueError):
    """A status change that the enum's transition table does not allow."""

    def __init__(self, table: str, source: Enum, target: Enum) -> None:
        self.table = table
        self.source = source
        self.target = target
        super().__init__(
            f"{table}: {source.name} → {target.name} is not an allowed transition "
            f"(run `corral states` to see the table)"
        )


@record
class Edge(Generic[S]):
    """One allowed transition and the rule that admits it."""

    source: S
    target: S
    label: str
    rule: str


class TransitionTable(Generic[S]):
    """The allowed transitions of one status enum, plus its initial and terminal statuses."""

    def __init__(
        self,
        name: str,
        enum: type[S],
        *,
        initial: S,
        terminal: Iterable[S],
        edges: Iterable[tuple[S | Iterable[S], S | Iterable[S], str, str]],
    ) -> None:
        self.name = name
        self.enum = enum
        self.initial = initial
        self.terminal: frozenset[S] = frozenset(terminal)
        self.non_terminal: frozenset[S] = frozenset(s for s in enum if s not in self.terminal)
        built: list[Edge[S]] = []
        seen: set[tuple[S, S]] = set()
        for sources, targets, label, rule in edges:
            for source in _members(enum, sources):
                for target in _members(enum, targets):
                    if source == target:
                        raise ValueError(f"{name}: self-loop {source.name} is not a transition")
                    if source in self.terminal:
                        raise ValueError(f"{name}: terminal {source.name} cannot have exits")
                    if (source, target) in seen:
                        continue  # an edge admitted by two rules keeps the first
                    seen.add((source, target))
                    built.append(Edge(source, target, label, rule))
        self.edges: tuple[Edge[S], ...] = tuple(built)
        self._targets: dict[S, frozenset[S]] = {
            s: frozenset(e.target for e in built if e.source == s) for s in enum
        }
        self._sources: dict[S, frozenset[S]] = {
            s: frozenset(e.source for e in built if e.target == s) for s in enum
        }

    def __iter__(self) -> Iterator[Edge[S]]:
        return iter(self.edges)

    def allowed(self, source: S, target: S) -> bool:
        """True when `source → target` is an edge of the table."""
        return target in self._targets[source]

    def targets(self, source: S) -> frozenset[S]:
        """Statuses reachable from `source` in one step."""
        return self._targets[source]

    def sources(self, target: S) -> frozenset[S]:
        """Statuses from which `target` can be entered in one step."""
        return self._sources[target]

    def check(self, sources: S | Iterable[S], target: S) -> None:
        """Raise IllegalTransitionError unless every status in `sources` may move to `target`."""
        for source in _members(self.enum, sources):
            if not self.allowed(source, target):
                raise IllegalTransitionError(self.name, source, target)

    def reachable(self, source: S) -> frozenset[S]:
        """Every status reachable from `source` in zero or more steps."""
        seen = {source}
        frontier = [source]
        while frontier:
            for nxt in self._targets[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        return frozenset(seen)

    def to_mermaid(self) -> str:
        """A Mermaid `stateDiagram-v2` of the table, one arrow per edge, labelled by its rule."""
        lines = ["stateDiagram-v2", f"    [*] --> {self.initial.name}"]
        grouped: dict[tuple[S, S], str] = {}
        for edge in self.edges:
            grouped[(edge.source, edge.target)] = edge.label
        for (source, target), label in grouped.items():
            lines.append(f"    {source.name} --> {target.name}: {label}")
        lines.extend(f"    {s.name} --> [*]" for s in self.enum if s in self.terminal)
        return "\n".join(lines)


def _members(enum: type[S], value: S | Iterable[S]) -> tuple[S, ...]:
    if isinstance(value, enum):
        return (value,)
    return tuple(value)  # type: ignore[arg-type]
