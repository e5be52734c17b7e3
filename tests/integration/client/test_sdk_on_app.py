"""The SDK and `corral run`'s follower against the real API app, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import io
import uuid
from contextlib import aclosing

import pytest

from corral.api.app import ApiContext
from corral.cli._follow import SessionFollower, Terminal
from corral.client import (
    AuthError,
    Client,
    ConflictError,
    NotFoundError,
    Session,
    UnreachableError,
    ValidationError,
)
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import AgentId, KernelId
from corral.store.kernel_logs import LogChunk, append_log_chunks
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.client.conftest import Connect

DEADLINE_S = 20.0
COMMAND = ["python", "-c", "print(1)"]


async def _running(world: ApiWorld, client: Client, session: Session) -> Session:
    """The session after the cluster placed and started it."""
    await world.cluster.settle()
    running = await client.get_session(session.id)
    assert running.status is SessionStatus.RUNNING
    return running


async def _write(world: ApiWorld, session: Session, stream: str, data: bytes) -> None:
    """The main kernel's agent uploads output."""
    assert session.kernels is not None
    kernel = session.kernels[0]
    assert kernel.agent_id is not None
    chunk = LogChunk(KernelId(kernel.id), stream, 0, data)
    await append_log_chunks(
        world.cluster.db, AgentId(kernel.agent_id), [chunk], world.cluster.clock()
    )


async def _exit(world: ApiWorld, session: Session, code: int) -> None:
    """The session's kernels exit with `code`, and the cluster notices."""
    assert session.kernels is not None
    await world.cluster.agent.exit([KernelId(k.id) for k in session.kernels], exit_code=code)
    await world.cluster.settle()


async def test_a_session_from_submission_to_removal(world: ApiWorld, connect: Connect) -> None:
    """Create, explain, run, read logs and history, end, and remove, all through the SDK."""
    alice = connect(world.alice)
    session = await alice.create_session(image="python", command=COMMAND, resources={"cpu": 1})
    assert (session.owner, session.status) == ("alice", SessionStatus.PENDING)
    assert session.resources.format_human() == "cpu=1"
    explanation = await alice.explain(session.id)
    assert (explanation.status, explanation.position) == (SessionStatus.PENDING, 1)
    running = await _running(world, alice, session)
    assert running.kernels is not None
    assert running.kernels[0].status is KernelStatus.RUNNING
    await _write(world, running, "stdout", b"hello\n")
    assert await alice.session_logs(session.id, offset=1) == b"ello\n"
    await _exit(world, running, 0)
    ended = await alice.get_session(session.id)
    assert (ended.status, ended.exit_code, ended.result) == (SessionStatus.TERMINATED, 0, "success")
    phases = [(h.phase, h.to_status) for h in await alice.session_history(session.id)]
    assert ("PromoteToRunning", "RUNNING") in phases
    assert (await alice.terminate_session(session.id)).outcome == "unchanged"
    await alice.delete_session(session.id)
    with pytest.raises(NotFoundError) as raised:
        await alice.get_session(session.id)
    assert raised.value.kind == "session-not-found"


async def test_the_apps_errors_raise_typed_exceptions(world: ApiWorld, connect: Connect) -> None:
    """Validation, visibility, authentication, permission and conflict errors, by type."""
    alice, bob = connect(world.alice), connect(world.bob)
    with pytest.raises(ValidationError) as invalid:
        await alice.create_session(image="python", command=COMMAND, resource_group="nowhere")
    assert [e.field for e in invalid.value.errors] == ["resource_group"]
    assert invalid.value.status == 422
    session = await alice.create_session(image="python", command=COMMAND)
    with pytest.raises(NotFoundError):
        await bob.get_session(session.id)
    with pytest.raises(AuthError) as forbidden:
        await alice.list_sessions(owner="bob")
    assert forbidden.value.status == 403
    with pytest.raises(ConflictError) as conflict:
        await alice.delete_session(session.id)
    assert conflict.value.kind == "session-not-ended"
    forged = connect(Caller(world.alice.user, {"Authorization": "Bearer crl_forged"}))
    with pytest.raises(AuthError) as unknown:
        await forged.me()
    assert unknown.value.status == 401


async def test_lists_page_through_cursors_and_filter(world: ApiWorld, connect: Connect) -> None:
    """Five sessions at two a page come back newest first; the admin filters by owner."""
    alice, admin = connect(world.alice), connect(world.admin)
    created = [(await alice.create_session(image="python", command=COMMAND)).id for _ in range(5)]
    await connect(world.bob).create_session(image="python", command=COMMAND)
    # The world's clock stands still: the order among equal creation times is the API's.
    listed = [s.id async for s in alice.iter_sessions(page_size=2)]
    assert sorted(listed) == sorted(created)
    assert len([s async for s in admin.iter_sessions(page_size=2)]) == 6
    only_alice = [s.id async for s in admin.iter_sessions(owner="alice")]
    assert only_alice == listed
    assert (await alice.list_sessions(status=["RUNNING", "ERROR"])).items == ()
    assert await alice.resolve_session_id(str(created[0])[:13]) == created[0]


async def test_follow_logs_ends_with_the_session(world: ApiWorld, connect: Connect) -> None:
    """A followed log yields the output written while it runs, and ends once it has ended."""
    alice = connect(world.alice)
    running = await _running(
        world, alice, await alice.create_session(image="python", command=COMMAND)
    )
    await _write(world, running, "stdout", b"first\n")
    streaming = asyncio.Event()

    async def follow() -> bytes:
        received = b""
        async for chunk in alice.follow_logs(running.id):
            received += chunk
            streaming.set()
        return received

    follower = asyncio.create_task(follow())
    async with asyncio.timeout(DEADLINE_S):
        await streaming.wait()  # open, and it sent what there was while the session runs
        await _exit(world, running, 0)
        assert await follower == b"first\n"


async def test_a_stopping_manager_ends_a_followed_log_and_the_sdk_says_the_session_runs_on(
    world: ApiWorld, connect: Connect, api_context: ApiContext
) -> None:
    """The manager stopping ends a followed log at once (it used to hold the shutdown for its
    grace period); the session still runs, so the SDK raises instead of ending as if it had."""
    alice = connect(world.alice)
    running = await _running(
        world, alice, await alice.create_session(image="python", command=COMMAND)
    )
    await _write(world, running, "stdout", b"first\n")
    streaming = asyncio.Event()
    received: list[bytes] = []

    async def follow() -> None:
        async for chunk in alice.follow_logs(running.id):
            received.append(chunk)
            streaming.set()

    follower = asyncio.create_task(follow())
    async with asyncio.timeout(DEADLINE_S):
        await streaming.wait()
        api_context.closing.set()
        with pytest.raises(UnreachableError, match="ended the log stream before the session"):
            await follower
    assert received == [b"first\n"]


async def test_a_stopping_manager_ends_a_followed_event_stream_and_the_sdk_says_so(
    world: ApiWorld, connect: Connect, api_context: ApiContext
) -> None:
    """The manager stopping ends a followed event stream; the SDK raises (the stream is never
    ended by the server otherwise), where it used to end the iteration as if done."""
    alice = connect(world.alice)
    session = await alice.create_session(image="python", command=COMMAND)
    events = alice.follow_events(since=0, entity_id=str(session.id))
    async with asyncio.timeout(DEADLINE_S), aclosing(events):
        first = await anext(events)
        assert first.entity_id == str(session.id)
        api_context.closing.set()
        with pytest.raises(UnreachableError, match="ended the event stream"):
            async for _ in events:
                pass


async def test_follow_events_replays_a_sessions_status_changes(
    world: ApiWorld, connect: Connect
) -> None:
    """With `since=0` and the session's id, the stream starts at its first status change."""
    alice = connect(world.alice)
    session = await alice.create_session(image="python", command=COMMAND)
    await _running(world, alice, session)
    statuses: list[str] = []
    events = alice.follow_events(since=0, entity_id=str(session.id))
    async with asyncio.timeout(DEADLINE_S), aclosing(events):
        async for event in events:
            if event.kind == "session.status_changed":
                statuses.append(event.payload["to"])
            if statuses[-1:] == ["RUNNING"]:
                break
    assert statuses[:2] == ["SCHEDULED", "PREPARING"]
    page = await alice.events(since=0, entity_id=str(session.id))
    assert {e.entity_id for e in page.items} == {str(session.id)}


async def test_agents_and_the_caller(world: ApiWorld, connect: Connect) -> None:
    """The cluster's agent is listed with its capacity; `me` names the token's user."""
    alice = connect(world.alice)
    (agent,) = [a async for a in alice.iter_agents()]
    assert agent.capacity.format_human() == "cpu=8 mem=16GiB"
    assert (agent.status, agent.schedulable, agent.kernels) == ("ALIVE", True, 0)
    me = await alice.me()
    assert (me.id, me.name, me.role) == (uuid.UUID(str(world.alice.user.user_id)), "alice", "user")


async def test_run_follows_a_session_to_its_exit_code(world: ApiWorld, connect: Connect) -> None:
    """`corral run`'s follower shows the phases, copies the output, and returns the exit code."""
    alice = connect(world.alice)
    session = await alice.create_session(image="python", command=COMMAND)
    stdout, stderr, lines = io.BytesIO(), io.BytesIO(), []
    shown_running = asyncio.Event()

    def say(line: str) -> None:
        lines.append(line)
        if line.endswith(" RUNNING"):
            shown_running.set()

    terminal = Terminal(stdout, stderr, say, lambda question: True)
    follower = asyncio.create_task(SessionFollower(alice, session, terminal).run())
    running = await _running(world, alice, session)
    await _write(world, running, "stdout", b"42\n")
    await _write(world, running, "stderr", b"warning\n")
    async with asyncio.timeout(DEADLINE_S):
        await shown_running.wait()
        await _exit(world, running, 3)
        assert await follower == 3
    assert (stdout.getvalue(), stderr.getvalue()) == (b"42\n", b"warning\n")
    assert lines[0] == f"session {session.number} ({session.id}) PENDING"
    phases = [line.split(" ")[-1] if line.startswith("session") else line for line in lines]
    assert [p for p in phases if not p.startswith("  ")][:6] == [
        "PENDING", "SCHEDULED", "PREPARING", "PREPARED", "CREATING", "RUNNING",
    ]  # fmt: skip
    assert lines[-1] == f"session {session.number} TERMINATED (failure), exit code 3"
