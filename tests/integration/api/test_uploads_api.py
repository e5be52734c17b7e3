"""Uploads through the real app: per owner, checked digests, a size cap, and the agent's fetch."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import random
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from corral.api.app import ApiContext, create_app
from corral.controller.agents import AgentController, AgentTimings
from corral.domain.spec import SessionSpec
from corral.domain.status import SessionStatus
from corral.store.database import Database
from tests.integration.api.conftest import JOIN, Caller, _caller
from tests.integration.coordination._harness import Cluster, make_cluster

CAP = 64 * 1024


@dataclass
class World:
    """The app (upload cap CAP) over a cluster without agents, and two users."""

    http: httpx.AsyncClient
    cluster: Cluster
    alice: Caller
    bob: Caller

    async def put(self, caller: Caller, data: bytes, digest: str | None = None) -> httpx.Response:
        digest = digest or hashlib.sha256(data).hexdigest()
        headers = {**caller.headers, "Content-Type": "application/gzip"}
        return await self.http.put(f"/v1/uploads/{digest}", content=data, headers=headers)

    async def join(self, agent_id: str) -> dict[str, str]:
        """Register an agent with the join token; the headers of its own token."""
        body = {"agent_id": agent_id, "address": "10.0.0.1", "slots": {"cpu": 4, "mem": "8g"}}
        joined = await self.http.post(
            "/v1/agents/register", json=body, headers={"Authorization": f"Bearer {JOIN}"}
        )
        assert joined.status_code == 201, joined.text
        return {"Authorization": f"Bearer {joined.json()['token']}"}


@pytest.fixture
async def world(db: Database) -> AsyncIterator[World]:
    """The app with a small upload cap; agents register over HTTP."""
    cluster = await make_cluster(db, [])
    agents = AgentController(
        db,
        cluster.hints,
        join_token=JOIN,
        timings=AgentTimings(heartbeat_timeout_s=30, assignment_wait_s=30, poll_recheck_s=60),
        clock=cluster.clock,
    )
    polls = asyncio.create_task(agents.polls.run())
    context = ApiContext(db=db, agents=agents, sessions=cluster.controller, upload_max_bytes=CAP)
    transport = httpx.ASGITransport(app=create_app(context))
    alice, bob = [await _caller(db, name, "user") for name in ("alice", "bob")]
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
        yield World(http, cluster, alice, bob)
    polls.cancel()
    await asyncio.gather(polls, return_exceptions=True)


def archive(files: dict[str, bytes]) -> bytes:
    """A tar.gz holding `files`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def test_an_upload_is_stored_once_per_owner(world: World) -> None:
    """PUT stores (201), again is a no-op (200); GET finds it for its owner only."""
    data = archive({"train.py": b"print('x')\n"})
    digest = hashlib.sha256(data).hexdigest()
    before = await world.http.get(f"/v1/uploads/{digest}", headers=world.alice.headers)
    assert before.status_code == 404
    first = await world.put(world.alice, data)
    assert first.status_code == 201, first.text
    assert first.json()["size_bytes"] == len(data)
    again = await world.put(world.alice, data)
    assert (again.status_code, again.json()["created_at"]) == (200, first.json()["created_at"])
    mine = await world.http.get(f"/v1/uploads/{digest}", headers=world.alice.headers)
    assert mine.json()["digest"] == digest
    theirs = await world.http.get(f"/v1/uploads/{digest}", headers=world.bob.headers)
    assert theirs.status_code == 404
    anonymous = await world.http.get(f"/v1/uploads/{digest}")
    assert anonymous.status_code == 401


async def test_bad_digests_and_bodies_are_refused_naming_the_field(world: World) -> None:
    """A malformed digest, a body of another digest, or a body that is no gzip: 422."""
    data = archive({"a": b"1"})
    malformed = await world.put(world.alice, data, digest="ABC")
    assert malformed.status_code == 422
    assert malformed.json()["errors"][0]["field"].endswith("digest")
    other = await world.put(world.alice, data, digest="0" * 64)
    assert other.status_code == 422
    assert other.json()["errors"] == [{"field": "digest", "message": other.json()["detail"]}]
    assert hashlib.sha256(data).hexdigest() in other.json()["detail"]
    plain = await world.put(world.alice, b"not gzip at all")
    assert (plain.status_code, plain.json()["errors"][0]["field"]) == (422, "body")


async def test_an_upload_over_the_cap_is_refused_naming_both_sizes(world: World) -> None:
    """A body past upload_max_bytes is a 413 that names its size and the cap; nothing stored."""
    data = gzip.compress(random.Random(7).randbytes(2 * CAP), mtime=0)  # incompressible
    refused = await world.put(world.alice, data)
    assert refused.status_code == 413
    assert f"the upload is {len(data)} bytes" in refused.json()["detail"]
    assert f"cap of {CAP} bytes" in refused.json()["detail"]
    digest = hashlib.sha256(data).hexdigest()

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for start in range(0, len(data), 4096):
            yield data[start : start + 4096]

    headers = {**world.alice.headers, "Content-Type": "application/gzip"}
    streamed = await world.http.put(f"/v1/uploads/{digest}", content=chunks(), headers=headers)
    assert streamed.status_code == 413
    assert f"cap of {CAP} bytes" in streamed.json()["detail"]
    assert (
        await world.http.get(f"/v1/uploads/{digest}", headers=world.alice.headers)
    ).status_code == 404


async def test_a_session_may_name_only_its_owners_uploads(world: World) -> None:
    """Naming an unknown or another user's upload is a 422 on `upload`; one's own is accepted."""
    data = archive({"train.py": b"print(1)\n"})
    digest = hashlib.sha256(data).hexdigest()
    assert (await world.put(world.alice, data)).status_code == 201
    body = {"image": "python", "command": ["python", "train.py"], "upload": digest}
    theirs = await world.http.post("/v1/sessions", json=body, headers=world.bob.headers)
    assert theirs.status_code == 422, theirs.text
    assert theirs.json()["errors"][0]["field"] == "upload"
    assert digest in theirs.json()["detail"]
    bad = await world.http.post(
        "/v1/sessions", json={**body, "upload": "f" * 64}, headers=world.alice.headers
    )
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (422, "upload")
    both = await world.http.post(
        "/v1/sessions", json={**body, "workdir": "/home/alice"}, headers=world.alice.headers
    )
    assert both.status_code == 422
    mine = await world.http.post("/v1/sessions", json=body, headers=world.alice.headers)
    assert mine.status_code == 201, mine.text


async def test_an_agent_fetches_the_upload_of_its_own_kernels_only(world: World) -> None:
    """The kernel's agent gets the archive; another agent, or a kernel without one, gets 404."""
    data = archive({"train.py": b"print(1)\n"})
    digest = hashlib.sha256(data).hexdigest()
    assert (await world.put(world.alice, data)).status_code == 201
    node1 = await world.join("node-1")
    spec = SessionSpec(image="python", command=["python", "train.py"], upload=digest)
    submitted = await world.cluster.controller.enqueue(spec, world.alice.user.user_id)
    await world.cluster.coordinator.run_all()
    session = await world.cluster.session(submitted.session_id)
    assert session.status is SessionStatus.PREPARING
    kernel = session.kernels[0]
    fetched = await world.http.get(f"/v1/agents/node-1/kernels/{kernel.id}/upload", headers=node1)
    assert fetched.status_code == 200, fetched.text
    assert fetched.content == data
    node2 = await world.join("node-2")
    stranger = await world.http.get(f"/v1/agents/node-2/kernels/{kernel.id}/upload", headers=node2)
    assert stranger.status_code == 404
    wrong_token = await world.http.get(
        f"/v1/agents/node-1/kernels/{kernel.id}/upload", headers=node2
    )
    assert wrong_token.status_code == 401
    plain = await world.cluster.submit()
    await world.cluster.coordinator.run_all()
    other_kernel = (await world.cluster.session(plain)).kernels[0]
    none = await world.http.get(
        f"/v1/agents/{other_kernel.agent_id}/kernels/{other_kernel.id}/upload",
        headers=node1 if other_kernel.agent_id == "node-1" else node2,
    )
    assert none.status_code == 404


async def test_the_same_tree_uploaded_twice_at_once_is_stored_once(world: World) -> None:
    """Two submits racing with one archive: one PUT stores it (201), the other finds it (200)."""
    data = archive({"train.py": b"print('race')\n"})
    first, second = await asyncio.gather(world.put(world.alice, data), world.put(world.alice, data))
    assert sorted([first.status_code, second.status_code]) == [200, 201]
    assert first.json()["created_at"] == second.json()["created_at"]
