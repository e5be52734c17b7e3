"""The proxy's route table: least outstanding requests first, round robin among equals."""

from __future__ import annotations

import hashlib

import pytest

from corral.domain.deployment import DeploymentAccess
from corral.proxy.table import AmbiguousNameError, RouteTable, TableEntry


def _table() -> RouteTable:
    table = RouteTable()
    table.replace(
        1, [TableEntry("d1", "llm", ["a:1", "b:2", "c:3"]), TableEntry("d2", "other", [])]
    )
    return table


def test_equal_replicas_take_turns() -> None:
    """With nothing in flight, each request starts at the next replica."""
    table = _table()
    firsts = [table.candidates("llm")[0].address for _ in range(6)]
    assert firsts == ["a:1", "b:2", "c:3", "a:1", "b:2", "c:3"]


def test_the_least_busy_replica_goes_first_and_the_others_follow() -> None:
    """A replica with fewer requests in flight is chosen; the rest are the fallbacks."""
    table = _table()
    a, b, c = table.candidates("d1")
    a.outstanding, b.outstanding, c.outstanding = 2, 0, 1
    assert [x.address for x in table.candidates("llm")] == ["b:2", "c:3", "a:1"]


def test_a_new_table_keeps_the_counts_of_replicas_it_keeps() -> None:
    """Replacing the table keeps in-flight counts of the replicas still in it."""
    table = _table()
    table.candidates("llm")[0].outstanding = 5  # a:1
    table.replace(2, [TableEntry("d1", "llm", ["a:1", "d:4"])])
    assert {b.address: b.outstanding for b in table.candidates("llm")} == {"a:1": 5, "d:4": 0}
    assert table.revision == 2


def test_no_replica_or_no_deployment_is_empty_and_a_shared_name_is_ambiguous() -> None:
    """None healthy or unknown: no candidates; a name two owners use: by id only."""
    table = _table()
    assert table.candidates("other") == []
    assert table.candidates("nope") == []
    table.replace(3, [TableEntry("d1", "llm", ["a:1"]), TableEntry("d3", "llm", ["e:5"])])
    with pytest.raises(AmbiguousNameError):
        table.candidates("llm")
    assert [b.address for b in table.candidates("d3")] == ["e:5"]


def test_a_deployment_by_token_admits_only_its_bearer_token() -> None:
    """Open: anyone; by token: `Bearer <its token>` only, not another secret or scheme."""
    token_hash = hashlib.sha256(b"crld_secret").hexdigest()
    table = RouteTable()
    table.replace(
        1,
        [
            TableEntry("d1", "open", ["a:1"]),
            TableEntry("d2", "closed", ["b:2"], DeploymentAccess.TOKEN, token_hash),
            TableEntry("d3", "tokenless", ["c:3"], DeploymentAccess.TOKEN, None),
        ],
    )
    opened, closed, tokenless = (table.find(n) for n in ("open", "closed", "tokenless"))
    assert opened is not None and closed is not None and tokenless is not None
    assert opened.admits(None)
    assert closed.admits(b"Bearer crld_secret")
    assert closed.admits(b"bearer crld_secret")
    for refused in (None, b"", b"Bearer", b"Bearer crl_users_token", b"Basic crld_secret"):
        assert not closed.admits(refused), refused
    assert not tokenless.admits(b"Bearer crld_secret")
