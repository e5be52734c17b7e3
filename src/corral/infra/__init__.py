"""Coordination infrastructure: hints, locks and events, each behind a small interface with an
in-process, a PostgreSQL and a Redis implementation."""

# The key prefix of a manager's hints, locks and events: managers of one cluster share it.
DEFAULT_PREFIX = "corral"
