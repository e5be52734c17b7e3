"""The chaos report: the summary names each check's verdict; the baseline adds the slowdown."""

from __future__ import annotations

from typing import Any

from corral.bench.chaos.report import baseline_report, summary
from corral.bench.chaos.run import _resumed_after


def _report(took_s: float, violations: int) -> dict[str, Any]:
    return {
        "config": {"managers": 3, "agents": 12, "sessions": 10, "fault": "none"},
        "database": "postgresql",
        "redis": False,
        "accepted": 10,
        "all_ended": violations == 0,
        "took_s": took_s,
        "manager_kills": 2,
        "agent_kills": 0,
        "outages": [],
        "ended_during_outages": [],
        "resumed_after_outages_s": [],
        "checks": [
            {"name": "no_overcommit", "checked": 5, "violations": violations,
             "examples": ["ledger: a1 cpu occupied 5 of 4"] * violations},
        ],
        "violations": violations,
    }  # fmt: skip


def test_the_summary_shows_each_verdict_and_the_examples() -> None:
    """A failed check shows its count and examples, and the summary ends in FAIL."""
    text = summary(_report(10.0, 1))
    assert "1 VIOLATIONS" in text
    assert "ledger: a1 cpu occupied 5 of 4" in text
    assert "(timed out)" in text
    assert text.endswith("FAIL: 1 violations")
    assert summary(_report(10.0, 0)).endswith("PASS")


def test_the_baseline_report_gives_the_slowdown_and_counts_both_runs() -> None:
    """The faulty run over the clean one is the slowdown; violations of either run count."""
    combined = baseline_report(_report(15.0, 0), _report(10.0, 1))
    assert combined["slowdown"] == 1.5
    assert combined["violations"] == 1
    assert "slowdown 1.5x" in summary(combined)


def test_progress_resumes_at_the_first_sample_with_more_ended_after_the_outage() -> None:
    """The time to resume counts from the outage's end to the first sample past it that has
    more sessions ended than at its end; an outage nothing ended after is None."""
    series = [(0.0, 0), (1.0, 5), (2.0, 5), (3.0, 5), (3.5, 5), (4.0, 9), (5.0, 9)]
    assert _resumed_after(series, [(1.5, 3.0)]) == [1.0]
    assert _resumed_after(series, [(4.5, 4.8)]) == [None]
