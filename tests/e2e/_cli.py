"""Running the `corral` command as a user does: a subprocess of this interpreter."""

from __future__ import annotations

import subprocess
import sys


def corral(
    *args: str, env: dict[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m corral ARGS` with `env`; never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
