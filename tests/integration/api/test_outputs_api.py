"""A session's output files through the real app: listed, downloaded one by one or all at once."""

from __future__ import annotations

import io
import tarfile
import uuid
from typing import Any

from corral.domain.types import AgentId, KernelId
from corral.store.kernel_logs import OutputBlob, store_outputs
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.store._factories import NOW


async def _ended_session(world: ApiWorld, caller: Caller, size: int) -> dict[str, Any]:
    """A session of `caller` with `size` kernels, run to its end, each kernel with outputs."""
    body = {"image": "python", "command": ["true"], "cluster_size": size}
    created = await world.http.post("/v1/sessions", json=body, headers=caller.headers)
    assert created.status_code == 201, created.text
    await world.cluster.settle()
    session: dict[str, Any] = (
        await world.http.get(f"/v1/sessions/{created.json()['id']}", headers=caller.headers)
    ).json()
    for kernel in session["kernels"]:
        index = kernel["cluster_index"]
        blobs = [
            OutputBlob(KernelId(uuid.UUID(kernel["id"])), "metrics.json", b'{"rank": %d}' % index),
            OutputBlob(KernelId(uuid.UUID(kernel["id"])), "ckpt/model.bin", bytes(10 + index)),
        ]
        await store_outputs(world.cluster.db, AgentId(kernel["agent_id"]), blobs, NOW)
    return session


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


async def test_outputs_are_listed_and_downloaded(world: ApiWorld) -> None:
    """The owner lists (kernel, name, size), downloads one file, and all as a tar.gz."""
    session = await _ended_session(world, world.alice, size=1)
    base = f"/v1/sessions/{session['id']}/outputs"
    listed = await world.http.get(base, headers=world.alice.headers)
    assert listed.status_code == 200, listed.text
    assert [(f["kernel"], f["name"], f["size_bytes"]) for f in listed.json()["items"]] == [
        (0, "ckpt/model.bin", 10),
        (0, "metrics.json", 11),
    ]
    one = await world.http.get(f"{base}/0/ckpt/model.bin", headers=world.alice.headers)
    assert (one.status_code, one.content) == (200, bytes(10))
    everything = await world.http.get(f"{base}/archive", headers=world.alice.headers)
    assert everything.headers["content-type"] == "application/gzip"
    assert _members(everything.content) == {
        "ckpt/model.bin": bytes(10),
        "metrics.json": b'{"rank": 0}',
    }
    missing = await world.http.get(f"{base}/0/nope.txt", headers=world.alice.headers)
    assert (missing.status_code, missing.json()["type"].rsplit("/", 1)[-1]) == (
        404,
        "output-not-found",
    )
    no_kernel = await world.http.get(f"{base}/5/metrics.json", headers=world.alice.headers)
    assert no_kernel.status_code == 404


async def test_several_kernels_get_a_folder_each_in_the_archive(world: ApiWorld) -> None:
    """A session of two kernels: its archive has kernel-0/ and kernel-1/."""
    session = await _ended_session(world, world.alice, size=2)
    archive = await world.http.get(
        f"/v1/sessions/{session['id']}/outputs/archive", headers=world.alice.headers
    )
    assert sorted(_members(archive.content)) == [
        "kernel-0/ckpt/model.bin",
        "kernel-0/metrics.json",
        "kernel-1/ckpt/model.bin",
        "kernel-1/metrics.json",
    ]
    assert _members(archive.content)["kernel-1/metrics.json"] == b'{"rank": 1}'


async def test_only_the_owner_and_admins_see_outputs(world: ApiWorld) -> None:
    """Another user gets 404 on every outputs route; an admin gets them; no token is a 401."""
    session = await _ended_session(world, world.alice, size=1)
    base = f"/v1/sessions/{session['id']}/outputs"
    for path in (base, f"{base}/archive", f"{base}/0/metrics.json"):
        assert (await world.http.get(path, headers=world.bob.headers)).status_code == 404
        assert (await world.http.get(path, headers=world.admin.headers)).status_code == 200
        assert (await world.http.get(path)).status_code == 401


async def test_a_session_without_outputs_lists_none(world: ApiWorld) -> None:
    """No files: an empty list, and an empty archive."""
    body = {"image": "python", "command": ["true"]}
    created = await world.http.post("/v1/sessions", json=body, headers=world.alice.headers)
    base = f"/v1/sessions/{created.json()['id']}/outputs"
    assert (await world.http.get(base, headers=world.alice.headers)).json() == {"items": []}
    archive = await world.http.get(f"{base}/archive", headers=world.alice.headers)
    assert _members(archive.content) == {}
