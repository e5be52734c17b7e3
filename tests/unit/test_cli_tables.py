"""The CLI's tables: aligned columns as rich printed them, each cell as written."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from corral.cli._remote import print_table

# Cells as corral fills them: ids, names, states, times; wide (CJK) and combining characters
# among them. No `[`: rich reads it as markup, which a table of names must not (below).
CELL = st.text(
    alphabet=st.one_of(
        st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters="[]\\"),
        st.sampled_from("中文字é\u0301ß-_:."),
    ),
    max_size=12,
)


def richs(headers: list[str] | None, rows: list[list[str]]) -> str:
    """What the tables printed with rich (the implementation before `print_table`'s own)."""
    table = Table(box=None, pad_edge=False, show_edge=False, show_header=headers is not None)
    for header in headers or [""] * max((len(row) for row in rows), default=0):
        table.add_column(header, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*row)
    out = io.StringIO()
    Console(file=out, width=100_000, force_terminal=False, no_color=True).print(table)
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


@given(
    headers=st.one_of(st.none(), st.lists(CELL.filter(str.strip), min_size=1, max_size=4)),
    rows=st.lists(st.lists(CELL, min_size=1, max_size=4), min_size=1, max_size=5),
)
def test_a_table_is_laid_out_as_rich_laid_it_out(
    headers: list[str] | None, rows: list[list[str]]
) -> None:
    """Same columns, widths and spacing as before, for any cells corral prints."""
    width = len(headers) if headers is not None else max(len(row) for row in rows)
    rows = [row[:width] for row in rows]
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        print_table(headers, rows)
    assert out.getvalue() == richs(headers, rows)


def test_a_cell_is_printed_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """A session named `[red]x` is shown so (rich read it as markup and printed `x`)."""
    print_table(["NAME", "STATUS"], [["[red]x", "RUNNING"], ["12_[3-9%2]", "PENDING"]])
    assert capsys.readouterr().out.splitlines() == [
        "NAME        STATUS",
        "[red]x      RUNNING",
        "12_[3-9%2]  PENDING",
    ]


def test_headers_are_bold_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the header line is bold; piped, no escape codes at all."""
    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stdout", out)
    print_table(["A", "B"], [["1", "2"]])
    assert out.getvalue() == "\033[1mA  B\033[0m\n1  2\n"
