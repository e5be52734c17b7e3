"""The proxy's load report: sent when its counts or its route table changed, else as a
keepalive well inside the manager's TTL, and again after a failed report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import pytest

from corral.client import Client
from corral.domain.deployment import PROXY_REPORT_KEEPALIVE_S, PROXY_REPORT_TTL_S
from corral.proxy.report import report_load
from corral.proxy.table import RouteTable, TableEntry
from tests.unit.proxy._fake_client import FakeClientContext


class _Stop(BaseException):
    """Ends the report loop after the ticks a test wants."""


class _Manager(FakeClientContext):
    """Records the reports the proxy sends, as (time, revision, inflight); fails on request."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reports: list[tuple[float, int, dict[str, dict[str, int]]]] = []
        self.fail_next = False

    async def report_proxy_load(
        self, proxy_id: str, table_revision: int, inflight: Mapping[str, Mapping[str, int]]
    ) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("connection refused")
        self.reports.append((self.now, table_revision, {d: dict(by) for d, by in inflight.items()}))


async def test_an_idle_proxy_reports_as_a_keepalive_and_a_change_at_once() -> None:
    assert PROXY_REPORT_KEEPALIVE_S * 2 < PROXY_REPORT_TTL_S  # one lost keepalive is no death
    manager, table = _Manager(), RouteTable()
    table.replace(1, [TableEntry("d1", "llm", ["a:1"])])
    (replica,) = table.candidates("llm")
    happenings = {
        5.0: lambda: setattr(replica, "outstanding", 3),  # a request burst
        6.0: lambda: table.replace(2, [TableEntry("d1", "llm", ["a:1", "b:2"])]),
        7.0: lambda: setattr(manager, "fail_next", True),  # the next report (8.0) fails
    }

    async def tick(seconds: float) -> None:
        manager.now += seconds
        if manager.now > 12:
            raise _Stop
        happenings.get(manager.now, lambda: None)()

    with pytest.raises(_Stop):
        await report_load(
            lambda: cast(Client, manager),
            table,
            "proxy-1",
            interval_s=1.0,
            keepalive_s=2.0,
            clock=lambda: manager.now,
            sleep=tick,
        )
    assert [(t, rev, load) for t, rev, load in manager.reports] == [
        (0.0, 1, {}),  # the first look
        (2.0, 1, {}),  # keepalives only while nothing changes
        (4.0, 1, {}),
        (5.0, 1, {"d1": {"a:1": 3}}),  # its counts changed: at the next look
        (6.0, 2, {"d1": {"a:1": 3}}),  # its table changed
        # 8.0, the keepalive, failed: sent again at the next look, keepalive due or not
        (9.0, 2, {"d1": {"a:1": 3}}),
        (11.0, 2, {"d1": {"a:1": 3}}),
    ]
