"""The agent's child processes (kernels' exit-status wrappers), started and watched without threads.

`spawn` starts a program with `posix_spawn` (vfork and exec: the agent's memory is not copied,
unlike subprocess's fork). `Child.wait` learns the end through a pidfd the event loop polls,
along with every other file it watches: one watcher for all kernels, where asyncio's default
child watcher on Python 3.11 starts a thread for each child to block in `waitpid`. Where the
kernel has no pidfds (Linux before 5.3) a thread waits instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
from collections.abc import Mapping, Sequence


class Child:
    """A process this agent started; `wait()` is its exit status as subprocess reports one."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        loop = asyncio.get_running_loop()
        self._ended: asyncio.Future[int] = loop.create_future()
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):  # no pidfds here: a thread waits
            waiting = asyncio.ensure_future(asyncio.to_thread(_wait_blocking, pid))
            waiting.add_done_callback(self._waited)
        else:
            loop.add_reader(self._pidfd, self._reap)

    async def wait(self) -> int:
        """Until the process ends; its exit status (negative: killed by that signal)."""
        return await asyncio.shield(self._ended)

    def send_signal(self, sig: signal.Signals) -> None:
        """Signal the process, unless it was reaped already (its pid may be another's now)."""
        if not self._ended.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped by another waiter on this process's children (asyncio's SafeChildWatcher,
            # if someone installs it): the status is lost to this one, so 255.
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return  # not ended yet
        self._close()
        if not self._ended.done():
            self._ended.set_result(os.waitstatus_to_exitcode(status))

    def _waited(self, waiting: asyncio.Future[int]) -> None:
        if not self._ended.done() and not waiting.cancelled():
            self._ended.set_result(waiting.result())

    def _close(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


def _wait_blocking(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    fds: Mapping[int, int],
    *,
    default_signals: Sequence[signal.Signals] = (),
) -> Child:
    """Start `argv` (argv[0] a path) in a session of its own, stdin from /dev/null.

    `fds` maps the child's descriptor to the agent's (1: stdout, 2: stderr, ...); every other
    descriptor of the agent is close-on-exec (Python opens them so) and stays out of it.
    `default_signals` are reset to their default action in the child.
    """
    # Each target is set from a descriptor above every target, so one dup2 cannot overwrite a
    # source a later one still needs (a pipe end the agent got as fd 3, say).
    top = max(fds, default=2) + 1
    moved = {target: _above(source, top) for target, source in fds.items()}
    try:
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
        ]
        actions.extend((os.POSIX_SPAWN_DUP2, source, target) for target, source in moved.items())
        pid = os.posix_spawn(
            argv[0],
            list(argv),
            dict(env),
            file_actions=actions,
            setsid=True,
            setsigdef=tuple(default_signals),
        )
    finally:
        for target, source in moved.items():
            if source != fds[target]:
                os.close(source)
    return Child(pid)


def _above(fd: int, floor: int) -> int:
    """`fd`, or a close-on-exec copy of it numbered `floor` or more when it is below."""
    if fd >= floor:
        return fd
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
