"""Following a submitted session to its end: phases on stderr, its logs untouched, Ctrl-C.

The session's status changes arrive as events (replayed from the session's first, then live),
which is what shows each phase once and in order. A poll re-reads the session every few
seconds all the same: it notices the end when logs are not followed, refreshes the scheduler's
reason while the session waits, and takes over showing phases if the event stream fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from contextlib import aclosing
from datetime import UTC, datetime
from typing import BinaryIO

from corral.cli._common import INTERRUPTED_EXIT
from corral.cli.session import describe_place
from corral.client import TERMINAL_STATUSES, Client, CorralError, LogStream, Session
from corral.domain.outcome import SessionResult
from corral.domain.record import record
from corral.domain.status import SessionStatus

STATUS_CHANGED = "session.status_changed"


@record
class FollowTimings:
    """How often the session is re-read without an event, and its queue place re-explained."""

    poll_interval_s: float = 2.0
    explain_interval_s: float = 10.0


@record
class Terminal:
    """Where a followed session's output and corral's progress go, and who answers questions."""

    stdout: BinaryIO  # the kernel's stdout, untouched
    stderr: BinaryIO  # the kernel's stderr, untouched
    say: Callable[[str], None]  # one line of corral's progress (to stderr)
    confirm: Callable[[str], bool]  # ask a yes/no question (blocking)


def confirm_on_terminal(question: str) -> bool:
    """Ask on the terminal, default no; without a terminal to ask, yes.

    A second Ctrl-C at the prompt also means yes: whoever presses it twice wants it stopped.
    """
    if not sys.stdin.isatty():
        return True
    sys.stderr.write(question)
    sys.stderr.flush()
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return True
    return answer.strip().lower() in {"y", "yes"}


def exit_code_of(session: Session) -> int:
    """The shell exit code for an ended session: its command's, else 0 on success, 1 if not.

    A session cancelled or timed out is never 0, even when its command exited 0 on SIGTERM.
    """
    code = session.exit_code
    if code is not None and code != 0:
        if code < 0:
            return min(128 - code, 255)  # killed by signal N: the shell says 128 + N
        return code if code <= 255 else 1
    if session.status is SessionStatus.TERMINATED and session.result is SessionResult.SUCCESS:
        return 0
    return 1


# What a session's retry has become (`domain.retry.decide.RetryDecision`'s values): once one
# of these, no further attempt of its chain follows it.
_NO_RETRY = frozenset({"exhausted", "not_retried", "succeeded", "stopped"})


async def follow_chain(
    client: Client,
    session: Session,
    terminal: Terminal,
    *,
    stream_logs: bool = True,
    timings: FollowTimings | None = None,
) -> int:
    """Follow a session and each retry of it to the end of its chain; the last one's exit code.

    Between two attempts it says why and when the next one runs: "attempt 2 of 3 after
    kernel_nonzero_exit, retrying in 30 s". A session without retries is followed alone.
    """
    timings = timings or FollowTimings()
    current = session
    while True:
        follower = SessionFollower(
            client, current, terminal, stream_logs=stream_logs, timings=timings
        )
        code = await follower.run()
        if code == INTERRUPTED_EXIT:
            return code
        retry = await _next_attempt(client, current, terminal, timings)
        if retry is None:
            return code
        current = retry


async def _next_attempt(
    client: Client, ended: Session, terminal: Terminal, timings: FollowTimings
) -> Session | None:
    """The retry of `ended` once it is decided (None: it has none)."""
    said_paused = False
    while True:
        session = await client.get_session(ended.id)
        if not session.max_retries or session.retry_decision in _NO_RETRY:
            if session.retry_decision in ("exhausted", "stopped") and session.retry_state:
                terminal.say(session.retry_state)
            return None
        if session.result is SessionResult.SUCCESS:
            return None
        chain = list(session.retry_chain or ())
        if session.retry_decision == "scheduled" and session.id in chain[:-1]:
            retry = await client.get_session(chain[chain.index(session.id) + 1])
            wait = ""
            if retry.starts_at is not None:
                left = (retry.starts_at - datetime.now(UTC)).total_seconds()
                wait = f", retrying in {left:.0f} s" if left >= 0.5 else ", retrying now"
            terminal.say(
                f"attempt {retry.retry_count + 1} of {retry.max_retries + 1} after "
                f"{retry.retry_cause}{wait} (session {retry.number})"
            )
            return retry
        if session.retry_state and "paused" in session.retry_state and not said_paused:
            said_paused = True
            terminal.say(f"{session.retry_state}; waiting (Ctrl-C stops waiting)")
        await asyncio.sleep(timings.poll_interval_s)


class SessionFollower:
    """Shows one session's phases until it ends, copying its main kernel's logs; its exit code."""

    def __init__(
        self,
        client: Client,
        session: Session,
        terminal: Terminal,
        *,
        stream_logs: bool = True,
        timings: FollowTimings | None = None,
    ) -> None:
        self.client = client
        self.submitted = session
        self.session_id = session.id
        self.number = session.number  # what the user is shown and types
        self.terminal = terminal
        self.stream_logs = stream_logs
        self.timings = timings or FollowTimings()
        self._shown: SessionStatus | None = None
        self._shown_reason = ""
        self._events_live = True
        self._wake = asyncio.Event()
        self._interrupted = asyncio.Event()
        self._terminated = False

    async def run(self) -> int:
        """Follow the session to its end; its exit code (130 after Ctrl-C)."""
        self._shown = self.submitted.status
        self._say(f"session {self.number} ({self.session_id}) {self.submitted.status.value}")
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self._interrupted.set)
        watcher = asyncio.create_task(self._watch())
        events = asyncio.create_task(self._follow_events())
        outputs: list[tuple[LogStream, BinaryIO]] = [
            ("stdout", self.terminal.stdout),
            ("stderr", self.terminal.stderr),
        ]
        copies = [
            asyncio.create_task(self._copy(stream, out))
            for stream, out in outputs
            if self.stream_logs
        ]
        # The logs end when the session has ended and all its output was sent; without them,
        # the watcher ends when it sees the session ended.
        ends = set(copies) if copies else {watcher}
        running: set[asyncio.Task[object]] = {watcher, *copies}
        try:
            while not all(task.done() for task in ends):
                interrupt = asyncio.create_task(self._interrupted.wait())
                done, _ = await asyncio.wait(
                    {*running, interrupt}, return_when=asyncio.FIRST_COMPLETED
                )
                interrupt.cancel()
                for task in done & running:
                    task.result()  # a failed watcher or log copy stops the command, loudly
                running -= done
                if self._interrupted.is_set():
                    self._interrupted.clear()
                    if not await self._on_interrupt():
                        return INTERRUPTED_EXIT
            final = await self.client.get_session(self.session_id)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            for task in (watcher, events, *copies):
                task.cancel()
            await asyncio.gather(watcher, events, *copies, return_exceptions=True)
        self._say_end(final)
        return INTERRUPTED_EXIT if self._terminated else exit_code_of(final)

    async def _on_interrupt(self) -> bool:
        """Ctrl-C: terminate on yes and keep following to the end; False: stop following."""
        if self._terminated:
            self._say(f"session {self.number} is terminating; not waiting for it")
            return False
        loop = asyncio.get_running_loop()
        # While asking, Ctrl-C interrupts the prompt itself (see confirm_on_terminal).
        loop.remove_signal_handler(signal.SIGINT)
        try:
            terminate = self.terminal.confirm(f"terminate session {self.number}? [y/N] ")
        finally:
            loop.add_signal_handler(signal.SIGINT, self._interrupted.set)
        if not terminate:
            self._say(
                f"session {self.number} keeps running; follow it with "
                f"`corral session logs -f {self.number}`"
            )
            return False
        result = await self.client.terminate_session(self.session_id)
        self._terminated = True
        self._say(f"session {self.number}: {result.outcome} (Ctrl-C again to stop waiting)")
        return True

    async def _watch(self) -> Session:
        loop = asyncio.get_running_loop()
        explained_at: float | None = None
        while True:
            self._wake.clear()  # before reading, so an event during the read is not lost
            session = await self.client.get_session(self.session_id)
            if not self._events_live and not session.is_terminal:
                self._show(session.status)
            if session.is_terminal:
                return session
            if session.status is SessionStatus.PENDING and (
                explained_at is None
                or loop.time() - explained_at >= self.timings.explain_interval_s
            ):
                explained_at = loop.time()
                await self._explain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.timings.poll_interval_s)

    async def _explain(self) -> None:
        why = await self.client.explain(self.session_id)
        if why.status is not SessionStatus.PENDING:
            return
        reason = f"{why.outcome}: {describe_place(why)} — {why.message}"
        if reason != self._shown_reason:
            self._shown_reason = reason
            self._say(f"  {reason}")

    async def _follow_events(self) -> None:
        events = self.client.follow_events(since=0, entity_id=str(self.session_id))
        try:
            async with aclosing(events):
                async for event in events:
                    if event.kind != STATUS_CHANGED:
                        continue
                    # The event's reason names the handler that moved the session: not shown.
                    target = SessionStatus(event.payload["to"])
                    if target not in TERMINAL_STATUSES:  # the end is shown once, with its exit code
                        self._show(target)
                    self._wake.set()
        except CorralError:
            pass  # events are a convenience: the poll shows the phases from now on
        finally:
            self._events_live = False
            self._wake.set()

    async def _copy(self, stream: LogStream, out: BinaryIO) -> None:
        chunks = self.client.follow_logs(self.session_id, stream=stream, kernel=0)
        async with aclosing(chunks):
            async for chunk in chunks:
                out.write(chunk)
                out.flush()

    def _show(self, status: SessionStatus) -> None:
        if status is not self._shown:
            self._shown = status
            self._say(f"session {self.number} {status.value}")

    def _say_end(self, session: Session) -> None:
        parts = [f"session {session.number} {session.status.value}"]
        if session.result is not None:
            parts.append(f" ({session.result.value})")
        if session.failure_cause:
            parts.append(f": {session.failure_cause}")
        if session.status_info and session.status_info != session.failure_cause:
            parts.append(f" ({session.status_info})")
        if session.exit_code is not None:
            parts.append(f", exit code {session.exit_code}")
        self._say("".join(parts))

    def _say(self, line: str) -> None:
        self.terminal.say(line)
