"""Logging a server's outage once: its first failure, then its first success after it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any


class OutageLog:
    """The first failure of an outage is a warning and the first success after it an info
    line; the calls in between are silent (a bus down for a minute fails thousands of calls)."""

    def __init__(self, logger: logging.Logger, failed: str, restored: str) -> None:
        self._logger = logger
        self._failed = failed
        self._restored = restored
        self.down = False

    def failure(self, fields: Mapping[str, Any]) -> None:
        """A call failed: warn with `fields` unless the outage is known already."""
        if not self.down:
            self.down = True
            self._logger.warning(self._failed, extra=dict(fields))

    def success(self, fields: Mapping[str, Any] | None = None) -> None:
        """A call went through: say the outage ended (with `fields`), if there was one."""
        if self.down:
            self.down = False
            self._logger.info(self._restored, extra=dict(fields or {}))
