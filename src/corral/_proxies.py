"""Whether the environment names an HTTP proxy, which only httpx of corral's HTTP clients honours.

The command line's plain calls (`client._http.PlainCall`, `http.client`) and the agent's
transport (`infra.keepalive_http`) connect directly; where a proxy is named they go over httpx,
which honours it and NO_PROXY (its `trust_env`). A module of its own: the command line's
quickest verbs import it and nothing else of the agent's or the daemons'.
"""

from __future__ import annotations

import os

# The variables that name a proxy, in either case.
PROXY_VARIABLES = frozenset({"http_proxy", "https_proxy", "all_proxy"})


def proxy_configured() -> bool:
    """Whether the environment names a proxy."""
    return any(name.lower() in PROXY_VARIABLES for name in os.environ)
