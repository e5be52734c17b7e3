"""The chaos run's report: a human summary, or the JSON, and whether it passed."""

from __future__ import annotations

from typing import Any


def baseline_report(faulty: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """The faulty run's report with the run without faults and the ratio of their durations."""
    ratio = faulty["took_s"] / clean["took_s"] if clean["took_s"] else None
    return {
        **faulty,
        "baseline": clean,
        "slowdown": round(ratio, 2) if ratio is not None else None,
        "violations": faulty["violations"] + clean["violations"],
    }


def summary(report: dict[str, Any]) -> str:
    """A few lines: what ran, how long, each check's verdict with examples."""
    config = report["config"]
    lines = [
        f"chaos: {config['managers']} managers, {config['agents']} agents, "
        f"{report['accepted']}/{config['sessions']} sessions accepted, "
        f"{report['database']}{' + redis' if report['redis'] else ''}, fault {config['fault']}",
        f"took {report['took_s']} s{'' if report['all_ended'] else ' (timed out)'}; "
        f"{report['manager_kills']} manager kills, "
        f"{report['agent_kills']} agent kills, outages {report['outages']} "
        f"(sessions ended during them: {report['ended_during_outages']}; "
        f"progress resumed after them in {report['resumed_after_outages_s']} s)",
    ]
    if "baseline" in report:
        lines.append(
            f"baseline without faults took {report['baseline']['took_s']} s: "
            f"slowdown {report['slowdown']}x"
        )
    for check in report["checks"]:
        verdict = "ok" if not check["violations"] else f"{check['violations']} VIOLATIONS"
        lines.append(f"  {check['name']:<34} {verdict} (checked {check['checked']})")
        lines.extend(f"      {example}" for example in check["examples"])
    lines.append("PASS" if not report["violations"] else f"FAIL: {report['violations']} violations")
    return "\n".join(lines)
