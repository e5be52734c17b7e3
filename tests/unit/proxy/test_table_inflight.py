"""The proxy's count of requests in flight, as it reports them: per deployment and replica,
replicas gone from the table (draining) included until their requests end."""

from __future__ import annotations

from corral.proxy.table import RouteTable, TableEntry


def test_inflight_counts_replicas_in_the_table_and_those_draining() -> None:
    """A replica taken out of the table with requests in flight is still reported (and gets
    no new request); once they end it is forgotten; one back in the table keeps its count."""
    table = RouteTable()
    table.replace(1, [TableEntry("d1", "llm", ["a:1", "b:2"])])
    a, b = sorted(table.candidates("llm"), key=lambda x: x.address)
    a.outstanding, b.outstanding = 2, 0
    assert table.inflight() == {"d1": {"a:1": 2}}

    table.replace(2, [TableEntry("d1", "llm", ["b:2"])])  # a:1 drains
    assert [x.address for x in table.candidates("llm")] == ["b:2"]
    assert table.inflight() == {"d1": {"a:1": 2}}
    a.outstanding = 1  # one of its requests ended
    assert table.inflight() == {"d1": {"a:1": 1}}

    table.replace(3, [TableEntry("d1", "llm", ["a:1", "b:2"])])  # back: the same count carries on
    (back,) = [x for x in table.candidates("llm") if x.address == "a:1"]
    assert back is a
    table.replace(4, [TableEntry("d1", "llm", ["b:2"])])
    a.outstanding = 0
    assert table.inflight() == {}
    table.replace(5, [TableEntry("d1", "llm", ["a:1"])])
    assert table.candidates("llm")[0] is not a  # forgotten once drained
