"""Unpacking a session's upload into a kernel's directory, safely.

The archive is the user's: extraction uses `tarfile`'s `data` filter, which refuses absolute
names, names leading out with `..`, links pointing outside the directory and device files,
and drops set-uid bits. A refused or broken archive fails the kernel's preparation with
`upload_failure` (retrying cannot mend it).
"""

from __future__ import annotations

import io
import shutil
import tarfile
import zlib
from pathlib import Path

from corral.agent.runtime import StageFailure
from corral.domain.failure_causes import FailureCause

UPLOAD_FAILURE_CAUSE = FailureCause.UPLOAD_FAILURE


def unpack_upload(data: bytes, into: Path) -> None:
    """Extract the tar.gz `data` into `into`, replacing what an earlier attempt left there."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(into, filter="data")
    # Not OSError: a full disk is the agent's fault, and the stage's retries may outlast it.
    except (tarfile.TarError, EOFError, zlib.error) as exc:  # EOFError: a truncated stream
        raise StageFailure(
            UPLOAD_FAILURE_CAUSE, f"cannot unpack the upload: {exc}", retryable=False
        ) from exc
