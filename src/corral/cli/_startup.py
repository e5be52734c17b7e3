"""What the command line does before it imports anything else, to start like a native tool.

httpx imports its own command line (`httpx._main`) when it is imported, and with it click, rich
and pygments: about 100 ms of CPU that no corral command uses. Marked absent in `sys.modules`
(None: a later import raises ImportError), httpx falls back to its stub `main` and imports none
of them. Imported first by `corral.cli`; a process that imported httpx already keeps it whole.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable"
