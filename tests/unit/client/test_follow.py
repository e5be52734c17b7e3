"""Following a session in `corral run`: phases without events, the scheduler's reason, Ctrl-C."""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable

import httpx
import pytest

from corral.cli._follow import (
    FollowTimings,
    SessionFollower,
    Terminal,
    confirm_on_terminal,
    exit_code_of,
)
from corral.client import Session, UnreachableError
from tests.unit.client._fake_api import FakeApi, session_json

INSTANT = FollowTimings(poll_interval_s=0, explain_interval_s=0)


class Screen:
    """A Terminal whose outputs are captured and whose questions get a fixed answer."""

    def __init__(self, answer: bool = True) -> None:
        self.stdout = io.BytesIO()
        self.stderr = io.BytesIO()
        self.lines: list[str] = []
        self.questions: list[str] = []
        self.answer = answer

    def terminal(self) -> Terminal:
        def confirm(question: str) -> bool:
            self.questions.append(question)
            return self.answer

        return Terminal(self.stdout, self.stderr, self.lines.append, confirm)


async def _follow(api: FakeApi, screen: Screen, session_id: str) -> int:
    async with api.client() as client:
        session = await client.get_session(session_id)
        return await SessionFollower(client, session, screen.terminal(), timings=INSTANT).run()


def _explained(api: FakeApi, session_id: str, times: int) -> Callable[[], bool]:
    return lambda: len(api.sent("GET", f"/v1/sessions/{session_id}/explain")) >= times


async def test_without_events_the_poll_shows_the_phases() -> None:
    """When the event stream is unavailable, phases come from re-reading the session."""
    api = FakeApi()
    api.events_available = False
    session_id = api.add_session()

    def polls() -> int:
        return len(api.sent("GET", f"/v1/sessions/{session_id}"))

    async def move_and_wait_for_two_polls(status: str) -> None:
        seen = polls() + 1
        await api.move(session_id, status)
        await api.until(lambda: polls() > seen)

    async def lifecycle(sid: str) -> None:
        await move_and_wait_for_two_polls("SCHEDULED")
        await move_and_wait_for_two_polls("RUNNING")
        await api.finish(sid, exit_code=0)

    api.on_follow = lifecycle
    screen = Screen()
    assert await _follow(api, screen, session_id) == 0
    phases = [line.rsplit(" ", 1)[-1] for line in screen.lines if not line.startswith("  ")]
    assert phases == ["PENDING", "SCHEDULED", "RUNNING", "0"]
    assert screen.lines[0] == f"session 1 ({session_id}) PENDING"  # the number, then the id
    assert screen.lines[-1] == "session 1 TERMINATED (success), exit code 0"


async def test_a_pending_session_shows_the_schedulers_reason_when_it_changes() -> None:
    """The reason is shown while PENDING, again only when it changes."""
    api = FakeApi()
    session_id = api.add_session()

    async def waits(sid: str) -> None:
        await api.until(_explained(api, sid, 2))
        api.explanation_message = "agent node-1 is draining"
        await api.until(_explained(api, sid, 4))
        await api.finish(sid, status="CANCELLED", exit_code=None)

    api.on_follow = waits
    screen = Screen()
    assert await _follow(api, screen, session_id) == 1
    assert [line for line in screen.lines if line.startswith("  ")] == [
        "  waiting: position 1 of 2 in resource group 'default' — no agent has 8 cpu free",
        "  waiting: position 1 of 2 in resource group 'default' — agent node-1 is draining",
    ]


async def test_ctrl_c_answered_yes_terminates_and_follows_to_the_end() -> None:
    """Yes: the session is terminated, its last output still copied, and the exit code is 130."""
    api = FakeApi()
    session_id = api.add_session(status="RUNNING")

    async def interrupted(sid: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await api.until(lambda: api.sessions[sid]["status"] == "TERMINATING")
        api.logs[(sid, "stdout")] = b"saving checkpoint\n"
        await api.finish(sid, exit_code=-15, result="cancelled")

    api.on_follow = interrupted
    screen = Screen(answer=True)
    assert await _follow(api, screen, session_id) == 130
    assert screen.questions == ["terminate session 1? [y/N] "]
    assert screen.stdout.getvalue() == b"saving checkpoint\n"
    assert screen.lines[-1] == "session 1 TERMINATED (cancelled), exit code -15"


async def test_ctrl_c_answered_no_leaves_the_session_running() -> None:
    """No: nothing is terminated; corral stops following, says how to resume, exits 130."""
    api = FakeApi()
    session_id = api.add_session(status="RUNNING")

    async def interrupted(sid: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await api.until(lambda: False)  # runs until the follower lets go

    api.on_follow = interrupted
    screen = Screen(answer=False)
    assert await _follow(api, screen, session_id) == 130
    assert not api.sent("POST", f"/v1/sessions/{session_id}/terminate")
    assert screen.lines[-1] == (
        "session 1 keeps running; follow it with `corral session logs -f 1`"
    )


async def test_a_second_ctrl_c_stops_waiting_for_the_termination() -> None:
    """After terminating, another Ctrl-C returns at once instead of waiting for the end."""
    api = FakeApi()
    session_id = api.add_session(status="RUNNING")

    async def interrupted(sid: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await api.until(lambda: api.sessions[sid]["status"] == "TERMINATING")
        os.kill(os.getpid(), signal.SIGINT)
        await api.until(lambda: False)

    api.on_follow = interrupted
    screen = Screen(answer=True)
    assert await _follow(api, screen, session_id) == 130
    assert screen.lines[-1] == "session 1 is terminating; not waiting for it"
    assert len(screen.questions) == 1


async def test_a_broken_log_stream_stops_the_follower_loudly() -> None:
    """A connection lost mid-stream raises UnreachableError instead of hanging or exiting 0."""
    api = FakeApi()
    session_id = api.add_session(status="RUNNING")

    async def broken(sid: str) -> None:
        raise httpx.ReadError("connection reset by peer")

    api.on_follow = broken
    with pytest.raises(UnreachableError, match=r"lost the connection .* connection reset by peer"):
        await _follow(api, Screen(), session_id)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"status": "TERMINATED", "exit_code": 0, "result": "success"}, 0),
        ({"status": "TERMINATED", "exit_code": None, "result": "success"}, 0),
        ({"status": "TERMINATED", "exit_code": None, "result": "failure"}, 1),
        ({"status": "TERMINATED", "exit_code": 2, "result": "failure"}, 2),
        ({"status": "TERMINATED", "exit_code": -9, "result": "failure"}, 137),
        ({"status": "TERMINATED", "exit_code": 256, "result": "failure"}, 1),
        ({"status": "ERROR", "exit_code": None}, 1),
        ({"status": "ERROR", "exit_code": 0}, 1),
        ({"status": "CANCELLED", "exit_code": None}, 1),
        ({"status": "TERMINATED", "exit_code": 0, "result": "cancelled"}, 1),
        ({"status": "TERMINATED", "exit_code": None, "result": "timeout"}, 1),
        ({"status": "TERMINATED", "exit_code": -15, "result": "cancelled"}, 143),
    ],
)
def test_exit_code_of_an_ended_session(fields: dict[str, object], code: int) -> None:
    """The command's code when known (a signal as 128 + N); else 0 exactly on success."""
    assert exit_code_of(Session.model_validate(session_json(**fields))) == code


class _Stdin(io.StringIO):
    def __init__(self, text: str, *, tty: bool, interrupt: bool = False) -> None:
        super().__init__(text)
        self.tty = tty
        self.interrupt = interrupt

    def isatty(self) -> bool:
        return self.tty

    def readline(self, size: int = -1) -> str:  # type: ignore[override]
        if self.interrupt:
            raise KeyboardInterrupt
        return super().readline(size)


@pytest.mark.parametrize(
    ("stdin", "answer"),
    [
        (_Stdin("", tty=False), True),
        (_Stdin("y\n", tty=True), True),
        (_Stdin("YES\n", tty=True), True),
        (_Stdin("\n", tty=True), False),
        (_Stdin("", tty=True), False),
        (_Stdin("", tty=True, interrupt=True), True),
    ],
)
def test_confirm_on_terminal(
    stdin: _Stdin, answer: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No terminal: yes. On a terminal: yes only for y/yes, or a second Ctrl-C; else no."""
    monkeypatch.setattr(sys, "stdin", stdin)
    assert confirm_on_terminal("terminate? [y/N] ") is answer
    assert capsys.readouterr().err.startswith("terminate? [y/N] " if stdin.tty else "")
