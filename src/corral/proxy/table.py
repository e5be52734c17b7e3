"""The proxy's route table: each deployment's healthy replicas, who may reach them, and which
replica gets a request (least outstanding requests, round robin among equals)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.domain.deployment import DeploymentAccess
from corral.domain.record import record


@dataclass
class Backend:
    """One replica and the requests in flight to it through this proxy."""

    address: str  # host:port
    outstanding: int = 0


@record
class TableEntry:
    """One deployment as the manager's route table gives it."""

    id: str
    name: str
    addresses: Sequence[str]  # host:port of each healthy replica
    access: DeploymentAccess = DeploymentAccess.OPEN
    token_hash: str | None = None  # SHA-256 (hex) of its token, for access by token


@dataclass
class Deployment:
    """A deployment the proxy serves: its replicas and who may reach them."""

    id: str
    backends: list[Backend]
    access: DeploymentAccess
    token_hash: str | None
    turn: itertools.count[int] = field(default_factory=itertools.count)

    def admits(self, authorization: bytes | None) -> bool:
        """Whether a request with this `Authorization` header value may pass: always when
        open; with `Bearer <the deployment's token>` when by token (compared by hash, in
        constant time)."""
        if self.access is DeploymentAccess.OPEN:
            return True
        if self.token_hash is None or authorization is None:
            return False
        scheme, _, secret = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not secret:
            return False
        digest = hashlib.sha256(secret.strip()).hexdigest()
        return hmac.compare_digest(digest, self.token_hash)

    def candidates(self) -> list[Backend]:
        """The replicas in the order to try them: fewest requests in flight first, round
        robin among equals."""
        backends = self.backends
        if not backends:
            return []
        start = next(self.turn) % len(backends)
        rotated = backends[start:] + backends[:start]
        return sorted(rotated, key=_outstanding)  # stable: rotation breaks ties


def _outstanding(backend: Backend) -> int:
    return backend.outstanding


class AmbiguousNameError(LookupError):
    """Several owners have a deployment of this name: the request must name it by id."""


class RouteTable:
    """Deployments by name and id; replaced whole when the manager's table changes."""

    def __init__(self) -> None:
        self.revision = -1
        self._by_id: dict[str, Deployment] = {}
        self._ids_by_name: dict[str, list[str]] = {}
        # Replicas gone from the table (draining) with requests still in flight to them:
        # reported until those end, so that the manager knows when a replica drained.
        self._retired: dict[tuple[str, str], Backend] = {}

    def replace(self, revision: int, deployments: Iterable[TableEntry]) -> None:
        """Install the table of `revision`. A replica kept across tables keeps its count of
        requests in flight."""
        live = {(dep_id, b.address): b for dep_id, d in self._by_id.items() for b in d.backends}
        kept: dict[tuple[str, str], Backend | None] = {**self._retired, **live}
        by_id: dict[str, Deployment] = {}
        names: dict[str, list[str]] = {}
        for entry in deployments:
            backends = [kept.pop((entry.id, a), None) or Backend(a) for a in entry.addresses]
            by_id[entry.id] = Deployment(entry.id, backends, entry.access, entry.token_hash)
            names.setdefault(entry.name, []).append(entry.id)
        self._by_id, self._ids_by_name, self.revision = by_id, names, revision
        self._retired = {k: b for k, b in kept.items() if b is not None and b.outstanding > 0}

    def find(self, ref: str) -> Deployment | None:
        """The deployment `ref` names (its name or id); None when it has no healthy replica
        or does not exist; AmbiguousNameError for a name several owners use."""
        found = self._by_id.get(ref)
        if found is not None:
            return found
        ids = self._ids_by_name.get(ref)
        if not ids:
            return None
        if len(ids) > 1:
            raise AmbiguousNameError(ref)
        return self._by_id[ids[0]]

    def candidates(self, ref: str) -> list[Backend]:
        """The replicas of the deployment `ref` names, in the order to try them (see
        `Deployment.candidates`); empty when none is healthy or there is no such deployment."""
        found = self.find(ref)
        return [] if found is None else found.candidates()

    def snapshot(self) -> Mapping[str, list[str]]:
        """Each deployment id's replica addresses (for logs and tests)."""
        return {i: [b.address for b in d.backends] for i, d in self._by_id.items()}

    def inflight(self) -> dict[str, dict[str, int]]:
        """Requests in flight through this proxy per deployment id and replica address, those
        to replicas gone from the table (draining) included; replicas with none left out."""
        counts: dict[str, dict[str, int]] = {}
        for dep_id, deployment in self._by_id.items():
            for backend in deployment.backends:
                if backend.outstanding > 0:
                    counts.setdefault(dep_id, {})[backend.address] = backend.outstanding
        for (dep_id, address), backend in list(self._retired.items()):
            if backend.outstanding > 0:
                by_address = counts.setdefault(dep_id, {})
                by_address[address] = by_address.get(address, 0) + backend.outstanding
            else:
                del self._retired[(dep_id, address)]  # drained
        return counts
