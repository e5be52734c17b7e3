"""The proxy's own Prometheus metrics (`GET /metrics` on the proxy): requests by deployment
and status code, and the time to the answer's head, in a registry of its own.

Deployments are labelled by id, never by name or owner (as the manager's `/metrics`, which
shows no session's name); `corral deploy ls --json` maps ids to names. Requests that named no
deployment the proxy serves are counted under `deployment="-"`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

# From a replica on the same host (a millisecond) to a model thinking before its first token.
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
UNKNOWN_DEPLOYMENT = "-"


class ProxyMetrics:
    """The proxy's counters and histogram; label children cached (a lookup per request)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._requests = Counter(
            "corral_proxy_requests",
            "Requests the proxy answered, by deployment id and the status code sent (the "
            "replica's, or the proxy's own 401/404/409/502/503/504).",
            ["deployment", "code"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "corral_proxy_response_start_seconds",
            "Time from a request's arrival at the proxy to its answer's head being sent "
            "(streamed bodies not included), by deployment id.",
            ["deployment"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._counted: dict[tuple[str, int], Counter] = {}
        self._timed: dict[str, Histogram] = {}

    def observe(self, deployment: str, code: int, latency_s: float) -> None:
        """One answered request."""
        counter = self._counted.get((deployment, code))
        if counter is None:
            counter = self._counted[deployment, code] = self._requests.labels(deployment, str(code))
        counter.inc()
        histogram = self._timed.get(deployment)
        if histogram is None:
            histogram = self._timed[deployment] = self._latency.labels(deployment)
        histogram.observe(latency_s)

    def render(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return generate_latest(self.registry)
