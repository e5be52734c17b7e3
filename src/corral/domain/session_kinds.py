"""What kind of session it is, and how its kernels spread: the words a spec and the command
line share (no pydantic here, so `corral run` names them without building the spec's model)."""

from __future__ import annotations

from enum import StrEnum


class SessionType(StrEnum):
    """What kind of work a session does."""

    BATCH = "BATCH"
    INTERACTIVE = "INTERACTIVE"
    INFERENCE = "INFERENCE"


class ClusterMode(StrEnum):
    """Whether a session's kernels share one agent or may spread over several."""

    SINGLE_NODE = "single-node"
    MULTI_NODE = "multi-node"
