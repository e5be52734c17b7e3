"""The exit-status wrapper a `process` kernel runs under: a few lines of `/bin/sh`, ~1 ms a kernel.

The agent starts `sh -c WRAPPER_SCRIPT corral-wrapper DIR EXIT_FILE SETSID PROCS... -- AS GO
ARGV...` in a session of its own, the status pipe on fd 3 (`argv()` builds it; `process._spawn`
starts it). The wrapper changes to DIR, then runs the kernel's side in the foreground, as a
subshell (a fork of the wrapper, no exec) that ends by exec'ing ARGV through `setsid`: the kernel
leads a session and process group of its own, as it would without the wrapper, and gets the
default signal dispositions (a background job of a shell would have SIGINT and SIGQUIT
ignored). That subshell applies the kernel's limits to itself — it writes its pid into each
cgroup's `cgroup.procs` file PROCS, and sets RLIMIT_AS to AS KiB unless AS is `-` — so they
hold before ARGV runs and nothing it forks escapes them. A staged kernel (GO is
`5`: the read end of the go pipe is fd 5) then writes `ready <pid>` to fd 3 and waits until the
agent writes a line to the go pipe; if the pipe closes instead (the agent gave the kernel up, or
died), it exits ABANDONED without running ARGV. Then it writes one line to fd 3 and execs ARGV:
`started <pid>`; or, instead, `failed <errno> <message>` when ARGV[0] is no command it can find,
`failed - <message>` when a limit could not be applied. (In the moment between `started` and
`setsid`, the kernel is still in the wrapper's group, so a signal for its group that finds none
goes to the kernel alone: `_process_kernel.signal_kernel`.) When the kernel ends, the wrapper writes
its status to EXIT_FILE (`{"exit_code": N}`, negative: killed by signal -N) and ends the same
way, so a parent waiting for the wrapper sees the kernel's own status.

A spare (`spare_argv`: EXIT_FILE is `-`, and PROCS... -- `spare`) is the same wrapper and subshell
made before any kernel is known, with no environment: after joining its cgroups the kernel's
side writes `spare <pid>` to fd 3 and waits for a line on fd 5 naming a script to source
(`spare_start`), which changes to the kernel's directory, exports its environment, sends its
output to the logs and sets AS GO ARGV, so the staged kernel's course follows; the wrapper
reads its EXIT_FILE's path from fd 6 once the kernel ended (none there: the spare was never
taken, nothing is written).

Why staged: everything up to the command — an exec, a fork and, where the kernel has cgroups,
its move into them, which on cgroup v1 waits for an RCU grace period (5 to 15 ms) unless another
move happened just before — is done while the kernel is prepared, so that starting it is one line
on a pipe (and two execs: `setsid`, ARGV).

Why a wrapper: an agent restarted under the `leave` policy is not the kernel's parent and cannot
wait for it; the file tells it how the kernel ended. The wrapper stays outside the kernel's
process group and cgroups, so SIGKILL to the group, or an OOM kill of the whole cgroup, still
leaves it to write the status. SIGTERM and SIGINT sent to the wrapper alone are caught and do
not end it (a shell runs its traps only once its foreground command ended): signal the kernel's
group, whose id is the kernel's pid. The wrapper's own messages (a shell names the signal that
killed its foreground command) go to /dev/null; the kernel's stderr is passed on as fd 4.

The shells keep their own values in variables named CORRAL_SH_* (`_V`): a shell exports each
variable it imported from the environment, with the value it last set, so a name a user may
give (`go`, `exit_file`) would have reached the kernel with the wrapper's value.
Two traces of the shells are left on the kernel: PWD names the directory it starts in (a shell
exports it; true, as a shell-started program sees it), and glibc's `posix_spawn` leaves its two
internal signals (32 and 33) ignored, which glibc programs re-arm at start anyway.

A shell reports a command killed by signal N as status 128 + N, so a kernel that exits with a
code above 128 by itself is recorded as killed by that signal (exit 137 reads as -9), the way
Docker and Kubernetes report both. This replaced a Python wrapper (`python -I -S`), which cost
~16 ms of CPU for every kernel started (the interpreter's start-up) against ~1 ms for `sh`; the
kernel's side was a second `sh` exec'd by `setsid` until session 36 (an exec costs ~0.5 ms of
CPU on the development VM, much of it glibc's start-up asking the CPU for its caches).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
from collections.abc import Mapping, Sequence

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
SPARE = "spare"  # AS of a spare: what it runs comes later, as a script to source (`spare_start`)
EXIT_PATH_FD = 6  # a spare's wrapper reads its EXIT_FILE here once the kernel ended
EXIT_PATH_LATER = "-"  # EXIT_FILE of a spare's wrapper: read from EXIT_PATH_FD
# The wrapper's own shell variables are named CORRAL_SH_*: a user may set no CORRAL_* variable
# (`RESERVED_ENV_PREFIX`) and the agent sets none of these, so none is imported from the
# kernel's environment, and none of the user's is changed and exported on to the kernel.
_V = "CORRAL_SH_"
_CGROUP_FAILED = f"failed {NO_ERRNO} cannot move the kernel into its cgroup ($1)"
_LIMIT_FAILED = f"failed {NO_ERRNO} cannot limit its address space to $1 KiB"
# The kernel's side, a subshell of the wrapper (a fork, no exec): learn its own pid ($$ is the
# wrapper's; a `cd -P` to /proc/self names it, and a `cd` back restores PWD and OLDPWD), enter
# the cgroups, (a spare: say so, wait for its start script and source it), limit the address
# space, wait to be started if staged, report, close the pipe, become ARGV in a session of its
# own through `setsid` (util-linux's calls setsid(2) and execs, keeping the pid).
_KERNEL_SCRIPT = (
    f"exec 2>&4 4>&- {EXIT_PATH_FD}<&-; "
    f"{_V}O=${{OLDPWD-}} {_V}H=${{OLDPWD+1}}; "
    f'cd -P /proc/self && {_V}ME=${{PWD##*/}} && cd -- "$OLDPWD" || exit 126; '
    f'if [ "${_V}H" ]; then OLDPWD=${_V}O; else unset OLDPWD; fi; '
    f'until [ "$1" = -- ]; do echo "${_V}ME" > "$1" || '
    f'{{ echo "{_CGROUP_FAILED}" >&3; exit 126; }}; shift; done; shift; '
    f'[ "$1" = {SPARE} ] && {{ echo "{SPARE} ${_V}ME" >&3; '
    f'read -r {_V}START <&{GO_FD} || exit {ABANDONED}; . "${_V}START"; }}; '
    f'[ "$1" = {NO_ADDRESS_LIMIT} ] || ulimit -v "$1"'
    f' || {{ echo "{_LIMIT_FAILED}" >&3; exit 126; }}; shift; '
    f'[ "$1" = {NOT_STAGED} ] || {{ echo "ready ${_V}ME" >&3; '
    f"read -r {_V}GO <&{GO_FD} || exit {ABANDONED}; exec {GO_FD}<&-; }}; shift; "
    'command -v -- "$1" >/dev/null 2>&1'
    ' || { echo "failed 2 No such file or directory: $1" >&3; exit 127; }; '
    f'echo "started ${_V}ME" >&3; exec 3>&-; exec "${_V}SETSID" -- "$@"'
)
# $1: the directory to start in, $2: the exit file (EXIT_PATH_LATER: read from EXIT_PATH_FD once
# the kernel ended; nothing there, none is written), $3: setsid, the rest: the kernel script's
# arguments (PROCS... -- AS GO ARGV..., or PROCS... -- SPARE). A status from 129 to 192 is a
# death by signal (1 to 64); the wrapper ends by the same signal (no core dump of its own), or,
# for a signal that does not end a process, exits 128 + N.
WRAPPER_SCRIPT = f"""{_V}OLD=${{OLDPWD-}} {_V}HAD_OLD=${{OLDPWD+1}}
cd -- "$1" || exit 126
if [ "${_V}HAD_OLD" ]; then OLDPWD=${_V}OLD; else unset OLDPWD; fi
{_V}EXIT=$2
{_V}SETSID=$3
shift 3
exec 4>&2 2>/dev/null
trap : TERM INT
({_KERNEL_SCRIPT})
{_V}STATUS=$?
if [ "${_V}STATUS" -gt 128 ] && [ "${_V}STATUS" -le 192 ]; then
{_V}STATUS=$((128 - {_V}STATUS)); fi
if [ "${_V}EXIT" = {EXIT_PATH_LATER} ]; then {_V}EXIT=; read -r {_V}EXIT <&{EXIT_PATH_FD}; fi
if [ "${_V}EXIT" ]; then printf '{{"exit_code": %d}}\\n' "${_V}STATUS" > "${_V}EXIT" || echo \\
"corral: cannot record the kernel's exit status in ${_V}EXIT" >&4; fi
if [ "${_V}STATUS" -lt 0 ]; then trap - TERM INT; ulimit -c 0; kill -s "$((-{_V}STATUS))" $$
exit $((128 - {_V}STATUS)); fi
exit "${_V}STATUS"
"""
# Variables a spare's start script must not set with `export`: the shell's own (they would
# change how the rest of the kernel's side runs). PWD is left out of it: its `cd` sets it, as
# the wrapper's does.
_SHELL_OWN = frozenset({"IFS", "PS1", "PS2", "PS4", "OPTIND", "PPID", "LINENO", "ENV"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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


def spare_argv(setsid: str, *, cgroup_procs: Sequence[str] = ()) -> list[str]:
    """The argv of a spare: the wrapper and the kernel's side in the cgroups whose
    `cgroup.procs` files are `cgroup_procs`, then `spare <pid>` on fd STATUS_FD and a wait for
    the path of a start script (`spare_start`) on fd GO_FD; the wrapper reads its exit file's
    path from fd EXIT_PATH_FD once the kernel ended."""
    return [
        *(SHELL, "-c", WRAPPER_SCRIPT, "corral-wrapper", "/", EXIT_PATH_LATER, setsid),
        *cgroup_procs,
        *("--", SPARE),
    ]


def can_take_spare(env: Mapping[str, str]) -> bool:
    """Whether a spare's start script can give the kernel exactly `env` (a shell can export
    only variables with names, and sets some of its own)."""
    return all(_NAME.match(name) and name not in _SHELL_OWN for name in env)


def spare_start(
    start_dir: str,
    env: Mapping[str, str],
    stdout: str,
    stderr: str,
    command: Sequence[str],
    *,
    address_space_kib: int | None = None,
) -> str:
    """The script a spare sources to become a staged kernel: start in `start_dir` with exactly
    `env` (as `argv()`'s wrapper would give it: PWD from the `cd`, OLDPWD only when `env` has
    it), its output appended to the (fresh) log files, then wait for go and run `command`.
    `can_take_spare(env)` must hold (PWD is left out: the `cd` sets it)."""
    limit = NO_ADDRESS_LIMIT if address_space_kib is None else str(address_space_kib)
    given = {name: value for name, value in env.items() if name != "PWD"}
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in given.items())
    failed = f"failed {NO_ERRNO} cannot change to its start directory %s\\n"
    directory = shlex.quote(start_dir)
    lines = [
        f"cd -- {directory} || {{ printf '{failed}' {directory} >&3; exit 126; }}",
        "unset OLDPWD",
        *([f"export {exports}"] if exports else []),
        f"exec >>{shlex.quote(stdout)} 2>>{shlex.quote(stderr)}",
        shlex.join(["set", "--", limit, str(GO_FD), *command]),
    ]
    return "\n".join(lines) + "\n"
