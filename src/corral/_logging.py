"""Logs of the daemons: one line per event, `time level event key=value ...` on stderr."""

from __future__ import annotations

import logging
import sys

# Attributes every LogRecord has; anything else was passed in `extra` and is printed.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class EventFormatter(logging.Formatter):
    """`2026-11-22T10:00:00 INFO agent.registered agent_id=n1 created=True`."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{key}={value}" for key, value in vars(record).items() if key not in _STANDARD
        )
        line = f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} {record.levelname} "
        line += record.getMessage() + (f" {fields}" if fields else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "INFO") -> None:
    """Send corral's events to stderr at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EventFormatter())
    root = logging.getLogger("corral")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
