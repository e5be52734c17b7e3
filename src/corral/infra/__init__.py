"""Coordination infrastructure: hints, locks and events, each behind a small interface with an
in-process, a PostgreSQL and a Redis implementation."""
