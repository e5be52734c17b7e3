"""The exit-status wrapper a `process` kernel runs under: a few lines of `/bin/sh`, ~1 ms a kernel.

The agent starts `sh -c WRAPPER_SCRIPT corral-wrapper DIR EXIT_FILE SETSID PROCS... -- AS GO
ARGV...` in a session of its own, the status pipe on fd 3 (`argv()` builds it; `process._spawn`
starts it). The wrapper changes to DIR, then runs the kernel in the foreground through `setsid`
and a second `sh`: the kernel leads a session and process group of its own, as it would without
the wrapper, and gets the default signal dispositions (a background job of a shell would have
SIGINT and SIGQUIT ignored). That second `sh` applies the kernel's limits to itself — it writes
its pid into each cgroup's `cgroup.procs` file PROCS, and sets RLIMIT_AS to AS KiB unless AS is
`-` — so they hold before ARGV runs and nothing it forks escapes them. A staged kernel (GO is
`5`: the read end of the go pipe is fd 5) then writes `ready <pid>` to fd 3 and waits until the
agent writes a line to the go pipe; if the pipe closes instead (the agent gave the kernel up, or
died), it exits ABANDONED without running ARGV. Then it writes one line to fd 3 and execs ARGV:
`started <pid>`; or, instead, `failed <errno> <message>` when ARGV[0] is no command it can find,
`failed - <message>` when a limit could not be applied. When the kernel ends, the wrapper writes
its status to EXIT_FILE (`{"exit_code": N}`, negative: killed by signal -N) and ends the same
way, so a parent waiting for the wrapper sees the kernel's own status.

Why staged: everything up to the command — three execs and, where the kernel has cgroups, its
move into them, which on cgroup v1 waits for an RCU grace period (5 to 15 ms) unless another move
happened just before — is done while the kernel is prepared, so that starting it is one line on
a pipe.

Why a wrapper: an agent restarted under the `leave` policy is not the kernel's parent and cannot
wait for it; the file tells it how the kernel ended. The wrapper stays outside the kernel's
process group and cgroups, so SIGKILL to the group, or an OOM kill of the whole cgroup, still
leaves it to write the status. SIGTERM and SIGINT sent to the wrapper alone are caught and do
not end it (a shell runs its traps only once its foreground command ended): signal the kernel's
group, whose id is the kernel's pid. The wrapper's own messages (a shell names the signal that
killed its foreground command) go to /dev/null; the kernel's stderr is passed on as fd 4.

Two traces of the shells are left on the kernel: PWD names the directory it starts in (a shell
exports it; true, as a shell-started program sees it), and glibc's `posix_spawn` leaves its two
internal signals (32 and 33) ignored, which glibc programs re-arm at start anyway.

A shell reports a command killed by signal N as status 128 + N, so a kernel that exits with a
code above 128 by itself is recorded as killed by that signal (exit 137 reads as -9), the way
Docker and Kubernetes report both. This replaced a Python wrapper (`python -I -S`), which cost
~16 ms of CPU for every kernel started (the interpreter's start-up) against ~1 ms for `sh`.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Sequence

SHELL = "/bin/sh"
SETSID = "setsid"  # util-linux's; the runtime finds it once (`find_setsid`) and passes its path
STATUS_FD = 3
EXEC_FAILED = 127
# Signals a Python process ignores and its children would inherit ignored (the wrapper's spawn
# resets them, as subprocess does): the kernel gets them at their defaults.
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)

NO_ADDRESS_LIMIT = "-"  # AS when the kernel's address space is not limited
GO_FD = 5  # a staged kernel's go pipe (its read end)
NOT_STAGED = "-"  # GO when the kernel starts at once
ABANDONED = 125  # a staged kernel's status when its go pipe closed before it was started
NO_ERRNO = "-"  # `failed - <message>`: a failure no errno names
_CGROUP_FAILED = f"failed {NO_ERRNO} cannot move the kernel into its cgroup ($1)"
_LIMIT_FAILED = f"failed {NO_ERRNO} cannot limit its address space to $1 KiB"
# The kernel's side, run by the second `sh` after `setsid`: enter the cgroups, limit the address
# space, wait to be started if staged, report, close the pipe, become ARGV.
_KERNEL_SCRIPT = (
    "exec 2>&4 4>&-; "
    f'until [ "$1" = -- ]; do echo $$ > "$1" || {{ echo "{_CGROUP_FAILED}" >&3; exit 126; }}; '
    "shift; done; shift; "
    f'[ "$1" = {NO_ADDRESS_LIMIT} ] || ulimit -v "$1"'
    f' || {{ echo "{_LIMIT_FAILED}" >&3; exit 126; }}; shift; '
    f'[ "$1" = {NOT_STAGED} ] || {{ echo "ready $$" >&3; '
    f"read -r go <&{GO_FD} || exit {ABANDONED}; exec {GO_FD}<&-; }}; shift; "
    'command -v -- "$1" >/dev/null 2>&1'
    ' || { echo "failed 2 No such file or directory: $1" >&3; exit 127; }; '
    'echo "started $$" >&3; exec 3>&-; exec "$@"'
)
# $1: the directory to start in, $2: the exit file, $3: setsid, the rest: the kernel script's
# arguments (PROCS... -- AS GO ARGV...). A status from 129 to 192 is a death by signal (1 to 64);
# the wrapper ends by the same signal (no core dump of its own), or, for a signal that does not
# end a process, exits 128 + N.
WRAPPER_SCRIPT = f"""old=${{OLDPWD-}} had_old=${{OLDPWD+1}}
cd -- "$1" || exit 126
if [ "$had_old" ]; then OLDPWD=$old; else unset OLDPWD; fi
exit_file=$2
setsid=$3
shift 3
exec 4>&2 2>/dev/null
trap : TERM INT
ulimit -c 0
"$setsid" {SHELL} -c '{_KERNEL_SCRIPT}' corral-kernel "$@"
status=$?
if [ "$status" -gt 128 ] && [ "$status" -le 192 ]; then status=$((128 - status)); fi
printf '{{"exit_code": %d}}\\n' "$status" > "$exit_file" || echo "corral: cannot record the \
kernel's exit status in $exit_file" >&4
if [ "$status" -lt 0 ]; then trap - TERM INT; kill -s "$((-status))" $$; exit $((128 - status)); fi
exit "$status"
"""


def find_setsid() -> str:
    """The path of `setsid` (OSError naming what to install when the host has none)."""
    found = shutil.which(SETSID, path=os.defpath + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        raise OSError(f"the process runtime needs {SETSID!r} (util-linux); install it")
    return found


def argv(
    start_dir: str,
    exit_file: str,
    setsid: str,
    command: list[str],
    *,
    cgroup_procs: Sequence[str] = (),
    address_space_kib: int | None = None,
    staged: bool = False,
) -> list[str]:
    """The argv that runs `command` in `start_dir` under the wrapper, in the cgroups whose
    `cgroup.procs` files are `cgroup_procs`, its address space limited to `address_space_kib`;
    `staged`: it waits for a line on fd GO_FD before it runs `command`."""
    limit = NO_ADDRESS_LIMIT if address_space_kib is None else str(address_space_kib)
    go = str(GO_FD) if staged else NOT_STAGED
    return [
        *(SHELL, "-c", WRAPPER_SCRIPT, "corral-wrapper", start_dir, exit_file, setsid),
        *cgroup_procs,
        *("--", limit, go),
        *command,
    ]
