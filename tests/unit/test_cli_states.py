"""`corral states`: every output format shows the transition tables exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from corral.cli import app
from corral.cli.states import render_lifecycles_markdown
from corral.domain.lifecycle import TransitionTable
from corral.domain.status import ALL_TRANSITION_TABLES

REPO_ROOT = Path(__file__).parents[2]
LIFECYCLES_DOC = REPO_ROOT / "docs" / "lifecycles.md"
TABLES: list[TransitionTable[Any]] = list(ALL_TRANSITION_TABLES)

runner = CliRunner()


def _run(*args: str) -> str:
    result = runner.invoke(app, ["states", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_states_names_every_status_of_every_table_in_plain_text() -> None:
    """Each table's section lists all its statuses, with no colour codes off a terminal."""
    output = _run()
    assert "\x1b" not in output
    starts = [output.index(table.name) for table in ALL_TRANSITION_TABLES]
    assert starts == sorted(starts)
    ends = [*starts[1:], len(output)]
    for table, start, end in zip(TABLES, starts, ends, strict=True):
        section = output[start:end]
        for member in table.enum:
            assert member.name in section, f"{table.name}: {member.name} missing"
        assert f"initial: {table.initial.name}" in section
        for terminal in table.terminal:
            assert terminal.name in section.split("terminal:", 1)[1]


def test_states_json_matches_the_tables_exactly() -> None:
    """`--json` holds each table's initial, terminal statuses and every edge, nothing more."""
    document = json.loads(_run("--json"))
    assert list(document) == [table.name for table in ALL_TRANSITION_TABLES]
    for table in ALL_TRANSITION_TABLES:
        entry = document[table.name]
        assert entry["initial"] == table.initial.name
        assert set(entry["terminal"]) == {s.name for s in table.terminal}
        printed = {(t["from"], t["to"], t["label"], t["rule"]) for t in entry["transitions"]}
        expected = {(e.source.name, e.target.name, e.label, e.rule) for e in table}
        assert printed == expected
        assert len(entry["transitions"]) == len(table.edges)


def test_states_mermaid_draws_one_diagram_per_table_with_every_edge() -> None:
    """`--mermaid` prints four state diagrams with an arrow for every edge."""
    output = _run("--mermaid")
    assert output.count("stateDiagram-v2") == len(ALL_TRANSITION_TABLES) == 4
    lines = output.splitlines()
    for table in ALL_TRANSITION_TABLES:
        assert f"%% {table.name}" in lines
        for edge in table:
            assert f"    {edge.source.name} --> {edge.target.name}: {edge.label}" in lines


def test_states_markdown_prints_the_lifecycles_document() -> None:
    """`--mermaid --markdown` prints exactly what docs/lifecycles.md must contain."""
    assert _run("--mermaid", "--markdown") == render_lifecycles_markdown()


def test_states_markdown_without_mermaid_is_a_usage_error() -> None:
    """`--markdown` alone is refused instead of being silently ignored."""
    result = runner.invoke(app, ["states", "--markdown"])
    assert result.exit_code == 2
    assert "--mermaid" in result.output


def test_states_json_and_mermaid_together_is_a_usage_error() -> None:
    """Only one output format at a time."""
    result = runner.invoke(app, ["states", "--json", "--mermaid"])
    assert result.exit_code == 2


def test_lifecycles_doc_is_up_to_date() -> None:
    """docs/lifecycles.md is the current rendering of the tables."""
    assert LIFECYCLES_DOC.read_text(encoding="utf-8") == render_lifecycles_markdown(), (
        "docs/lifecycles.md is stale: run `make docs`"
    )
