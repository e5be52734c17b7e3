"""The queue and session pages show all-or-nothing admission (issue 36), over HTTP on SQLite
and PostgreSQL: an evicted session's reason, requeue count and time; a deactivated one with
its Activate button (CSRF, owner or admin); the session a blocking group waits for."""

from __future__ import annotations

import html
import uuid
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from corral.domain.admission import KERNELS_READY_TIMEOUT
from corral.store.tables import sessions
from tests.integration.api.conftest import ApiWorld
from tests.integration.web.test_dashboard import csrf_of, sign_in, submit

# More cpu than the cluster's agent has: pending for ever, its explanation says why.
TOO_BIG = {"resources": {"cpu": 64}}


async def _set(world: ApiWorld, session_id: str, **values: Any) -> None:
    async with world.cluster.db.transaction() as conn:
        await conn.execute(
            sessions.update().where(sessions.c.id == uuid.UUID(session_id)).values(**values)
        )


async def test_the_queue_shows_evicted_and_deactivated_sessions(world: ApiWorld) -> None:
    """An evicted session shows its eviction reason, requeue count and requeue time; a
    deactivated one an Activate button that needs the CSRF token and puts it back in the
    queue; Bob can neither see nor activate Alice's."""
    now = world.cluster.clock()
    evicted = await submit(world, world.alice, name="evicted-one", **TOO_BIG)
    parked = await submit(world, world.alice, name="parked-one", **TOO_BIG)
    back_at = now + timedelta(minutes=5)
    await _set(
        world,
        evicted["id"],
        evicted_at=now - timedelta(seconds=30),
        eviction_reason=KERNELS_READY_TIMEOUT,
        requeue_count=2,
        requeue_at=back_at,
    )
    await _set(
        world,
        parked["id"],
        evicted_at=now - timedelta(seconds=20),
        eviction_reason=KERNELS_READY_TIMEOUT,
        requeue_count=3,
        requeue_active=False,
        deactivated_at=now - timedelta(seconds=20),
    )
    alice = await sign_in(world, world.alice)
    queue = await world.http.get("/ui/queue", headers=alice)
    text = html.unescape(queue.text)
    assert 'data-admission="evicted"' in text
    assert f'<code class="eviction-reason">{KERNELS_READY_TIMEOUT}</code>' in text
    assert 'data-requeue-count="2"' in text
    assert back_at.strftime("%Y-%m-%d %H:%M:%S") in text
    assert 'data-admission="deactivated"' in text
    assert f'action="/ui/sessions/{parked["id"]}/activate"' in text
    bob = await sign_in(world, world.bob)
    assert "parked-one" not in (await world.http.get("/ui/queue", headers=bob)).text
    url = f"/ui/sessions/{parked['id']}/activate"
    theirs = await world.http.post(url, data={"csrf_token": csrf_of(bob)}, headers=bob)
    assert theirs.status_code == 404
    refused = await world.http.post(url, data={"back": "queue"}, headers=alice)
    assert refused.status_code == 403
    assert refused.json()["type"].endswith("/csrf-token-invalid")
    shown = await world.http.get(f"/v1/sessions/{parked['id']}", headers=world.alice.headers)
    assert shown.json()["active"] is False
    done = await world.http.post(
        url, data={"csrf_token": csrf_of(alice), "back": "queue"}, headers=alice
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/ui/queue"
    shown = await world.http.get(f"/v1/sessions/{parked['id']}", headers=world.alice.headers)
    assert shown.json()["active"] is True and shown.json()["requeue_count"] == 0
    after = (await world.http.get("/ui/queue", headers=alice)).text
    assert 'data-admission="deactivated"' not in after
    page = html.unescape(
        (await world.http.get(f"/ui/sessions/{evicted['id']}", headers=alice)).text
    )
    assert 'id="admission"' in page and KERNELS_READY_TIMEOUT in page and "requeue 2" in page


async def test_a_blocking_group_names_the_session_it_waits_for(world: ApiWorld) -> None:
    """With block_admission on, the queue names the admitted session whose kernels are not
    ready, with its KernelsReady reason and since when; its page shows the condition."""
    changed = await world.http.patch(
        "/v1/resource-groups/default",
        json={"options": {"wait_for_kernels_ready": {"enable": True, "block_admission": True}}},
        headers=world.admin.headers,
    )
    assert changed.status_code == 200, changed.text
    admitted = await submit(world, world.alice, name="admitted")
    await world.cluster.settle()
    since = world.cluster.clock() - timedelta(seconds=42)
    await _set(
        world,
        admitted["id"],
        kernels_ready=False,
        kernels_ready_reason="WaitForStart",
        kernels_ready_at=since,
    )
    waiting = await submit(world, world.alice, name="waiting")
    alice = await sign_in(world, world.alice)
    text = html.unescape((await world.http.get("/ui/queue", headers=alice)).text)
    assert f'data-blocker="{admitted["id"]}"' in text
    assert f"session #{admitted['number']}</a>" in text
    assert "KernelsReady: <code>WaitForStart</code>" in text and "42s ago" in text
    assert waiting["id"] in text
    page = (await world.http.get(f"/ui/sessions/{admitted['id']}", headers=alice)).text
    assert 'data-ready="false" data-reason="WaitForStart"' in page
    await submit(world, world.bob, name="bobs-waiting")
    bob = await sign_in(world, world.bob)
    theirs = html.unescape((await world.http.get("/ui/queue", headers=bob)).text)
    assert "the group waits for another user's session" in theirs
    assert admitted["id"] not in theirs and "admitted" not in theirs.replace("admitted but", "")
    async with world.cluster.db.read() as conn:
        status = await conn.scalar(
            sa.select(sessions.c.status).where(sessions.c.id == uuid.UUID(waiting["id"]))
        )
    assert status == "PENDING"
