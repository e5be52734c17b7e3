"""`corral bench dashboard` on a small database: every page is timed and answered 200."""

from __future__ import annotations

from corral.bench.dashboard import PAGES, run_dashboard_bench


async def test_the_dashboard_bench_times_every_page() -> None:
    """A run over 200 sessions gives each page a p50 and a p95 no smaller than it."""
    result = await run_dashboard_bench("sqlite", sessions=200, requests=3)
    assert (result.backend, result.sessions) == ("sqlite", 200)
    assert set(result.pages) == set(PAGES)
    for figures in result.pages.values():
        assert 0 < figures["p50_ms"] <= figures["p95_ms"]
