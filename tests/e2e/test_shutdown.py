"""Stopping with long-lived responses open: followed events, an open dashboard, a followed log."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.domain.status import SessionStatus
from corral.domain.types import KernelId
from corral.store.log_reading import read_log
from tests.e2e._cluster import live_cluster, poll
from tests.e2e._up import Up, start_up

STOP_DEADLINE_S = 60.0


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent, for this test alone (it is stopped in the test)."""
    yield from start_up(tmp_path)


def test_corral_up_stops_at_once_with_streams_open_and_each_client_sees_its_end(up: Up) -> None:
    """Ctrl-C while a client follows the events, a dashboard page is open and a running
    session's log is followed: `corral up` stops without waiting out its 10 s grace period
    (it used to, and then printed a traceback for each stream it cancelled), every stream
    ends for its client, and the agent's report of the kernel it stopped is delivered (uvicorn
    used to take the signal and close the API first: the agent tried for 10 s more)."""
    url = up.said_after("corral is up at ")
    token = up.said_after("admin token: ")
    submitted = up.corral("run", "--detach", "--", "sleep", "600")
    assert submitted.returncode == 0, submitted.stderr
    number = submitted.stdout.strip()
    with (
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as api,
        httpx.Client(base_url=url) as browser,
    ):
        signed_in = browser.post(
            "/ui/sign-in", data={"token": token, "next": "/ui"}, headers={"origin": url}
        )
        assert signed_in.status_code == 303
        streams = {
            "events": (api, "/v1/events"),
            "dashboard": (browser, "/ui/stream"),
            "log": (api, f"/v1/sessions/{number}/logs?follow=true"),
        }
        opened = {name: threading.Event() for name in streams}
        ended: dict[str, str] = {}

        def hold(name: str, client: httpx.Client, path: str) -> None:
            try:
                with client.stream("GET", path, timeout=httpx.Timeout(10, read=None)) as answer:
                    assert answer.status_code == 200, answer.read()
                    opened[name].set()
                    for _ in answer.iter_raw():
                        pass
                ended[name] = "ended"
            except httpx.HTTPError as exc:
                ended[name] = type(exc).__name__

        threads = [
            threading.Thread(target=hold, args=(name, *where), daemon=True)
            for name, where in streams.items()
        ]
        for thread in threads:
            thread.start()
        for name, event in opened.items():
            assert event.wait(STOP_DEADLINE_S), f"the {name} stream did not open"
        up.process.send_signal(signal.SIGINT)
        assert up.process.stdout is not None
        said_while_stopping = up.process.stdout.read()
        assert up.process.wait(STOP_DEADLINE_S) == 0
        for thread in threads:
            thread.join(STOP_DEADLINE_S)
        assert ended == dict.fromkeys(streams, "ended")
        assert "graceful shutdown exceeded" not in said_while_stopping
        assert "Traceback" not in said_while_stopping, said_while_stopping
        # The local agent stopped the session's kernel and reported it before the API went.
        assert "reports_undelivered" not in said_while_stopping, said_while_stopping


def test_a_second_ctrl_c_kills_a_kernel_that_ignores_sigterm_at_once(up: Up) -> None:
    """The first Ctrl-C says what stopping does (a kernel has its grace period between SIGTERM
    and SIGKILL); a second one kills a kernel that ignores SIGTERM at once, instead of after
    the grace period, and `corral up` ends cleanly."""
    submitted = up.corral(
        "run", "--detach", "--image", "shell", "--", "trap '' TERM; echo ready; sleep 600"
    )
    assert submitted.returncode == 0, submitted.stderr
    number = submitted.stdout.strip()
    deadline = time.monotonic() + STOP_DEADLINE_S
    while "ready" not in up.corral("session", "logs", number).stdout:  # the trap is set
        assert time.monotonic() < deadline, "the kernel did not start"
        time.sleep(0.1)
    assert up.process.stdout is not None
    up.process.send_signal(signal.SIGINT)
    said = []
    for line in up.process.stdout:
        said.append(line)
        if line.startswith("stopping:"):
            break
    assert "Ctrl-C again to kill them now" in said[-1], said
    up.process.send_signal(signal.SIGINT)
    rest = up.process.stdout.read()
    assert up.process.wait(STOP_DEADLINE_S) == 0
    assert "runtime.kernel_killed" in rest and "grace_s=0" in rest, rest


async def test_a_second_sigterm_makes_a_stopping_agent_kill_its_kernels_at_once(
    database_url: str, tmp_path: Path
) -> None:
    """`corral agent` given a long stop grace: SIGTERM starts its stop, its kernel ignoring
    SIGTERM would have the whole grace period; a second SIGTERM kills it at once."""
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=2,mem=2g", "--stop-grace", "600")
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="shell", command=["trap '' TERM; echo ready; sleep 600"], resources={"cpu": 1}
        )
        await cluster.wait_status(sid, {SessionStatus.RUNNING})
        (kernel,) = await cluster.kernels(sid)

        async def trapped() -> bool:  # its output says the trap is set
            return b"ready" in await read_log(cluster.db, KernelId(kernel["id"]), "stdout")

        await poll(trapped, what="the kernel to set its trap", log=cluster)
        agent = cluster.agents["node-a"]
        agent.send_signal(signal.SIGTERM)

        async def stopping() -> bool:
            return "agent.shutting_down" in cluster.agent_log("node-a")

        await poll(stopping, what="the agent to begin stopping its kernel", log=cluster)
        agent.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(agent.wait, STOP_DEADLINE_S) == 0
        assert "grace_s=0" in cluster.agent_log("node-a")
