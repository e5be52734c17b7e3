"""`corral bench endings` on both backends: the endings it times really happen, by either path."""

from __future__ import annotations

import pytest

from corral.bench.endings import Path, run_endings_bench
from tests.conftest import POSTGRES_URL, require_server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, postgres_unreachable: str | None) -> str:
    """What the bench is given: `sqlite`, or the PostgreSQL server it makes a scratch db on."""
    if request.param == "postgresql":
        require_server("PostgreSQL", postgres_unreachable)
        return POSTGRES_URL
    return "sqlite"


@pytest.mark.parametrize("path", ["report", "tasks"])
async def test_the_sessions_reported_ended_end_and_the_others_keep_running(
    server: str, path: Path
) -> None:
    """45 of 60 end in batches of 20 (the last one short); the bench's own check, which raises
    when an ended session is not TERMINATED or another is not RUNNING, passes."""
    result = await run_endings_bench(server, running=60, ending=45, batch=20, path=path)
    figures = result.as_json()
    assert figures["backend"] == ("sqlite" if server == "sqlite" else "postgresql")
    assert (figures["path"], figures["running"], figures["ending"]) == (path, 60, 45)
    assert result.seconds > 0


@pytest.mark.parametrize(
    ("running", "ending", "batch", "field"),
    [(10, 11, 5, "ending"), (10, 0, 5, "ending"), (10, 5, 0, "batch")],
)
async def test_impossible_sizes_are_refused_by_name(
    running: int, ending: int, batch: int, field: str
) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        await run_endings_bench(
            "sqlite", running=running, ending=ending, batch=batch, path="report"
        )
