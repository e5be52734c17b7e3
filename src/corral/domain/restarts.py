"""The opt-in kernel restart policy (issue 36): a session's `restart_limit` and how far a
kernel's restarts have come.

A kernel whose process exits non-zero while RUNNING is started again on the same agent, by the
progress machine's own ERROR → GENERATING edge (spec document 3), until it has been restarted
`restart_limit` times; the next non-zero exit fails it as without the policy. The agent decides
each restart (it alone starts processes, so a report re-sent after a lost answer cannot start
one twice) and reports it twice: when the kernel went down (`restarting`) and when it runs
again. The manager only records them, in order: `restart_position` makes that order one
integer, so a report the kernel has passed is acknowledged and never applied again.
"""

from __future__ import annotations

# A policy that restarts a crashing kernel a hundred times is a loop, not a policy.
MAX_RESTART_LIMIT = 100


def restart_position(restarts: int, restarting: bool) -> int:
    """Where a kernel stands among its restarts, as one increasing number: never restarted
    (0, running) is 1; restart n is 2n while it is being started and 2n + 1 once it runs."""
    return 2 * restarts + (0 if restarting else 1)
