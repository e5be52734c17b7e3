"""One poisoned row never stops a loop or a route for anyone else (issue 33), on SQLite and
PostgreSQL: rows no check of today lets in are written straight into the store, then a
scheduling pass, a listing, an agent's assignment, a promotion and the event stream must each
isolate that one row (its session failed, `invalid_request`) and serve the others."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa

from corral.domain.outcome import INVALID_REQUEST, SessionResult
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, utcnow
from corral.store.database import Database
from corral.store.events import read_events
from corral.store.tables import agents, events, kernels, sessions
from tests.integration.api.conftest import JOIN, ApiWorld
from tests.integration.api.test_sessions_api import create

S = SessionStatus
# A spec no reader can take, on both backends: JSON, but no object.
NOT_AN_OBJECT: list[Any] = ["not", "a", "spec"]
# Text that cannot be encoded (a lone surrogate): only SQLite stores it (PostgreSQL's JSON
# refuses it), as it did before submissions were checked.
SURROGATE_SPEC = {"image": "python", "command": ["echo", "\ud800"], "resources": {"cpu": 1}}


async def submitted(world: ApiWorld, caller: Any, **fields: Any) -> SessionId:
    response = await create(world, caller, **fields)
    assert response.status_code == 201, response.text
    return SessionId(uuid.UUID(response.json()["id"]))


def admin(world: ApiWorld) -> dict[str, str]:
    return world.admin.headers


async def write_row(db: Database, sid: SessionId, **values: Any) -> None:
    """Overwrite columns of a session's row, as no API would."""
    async with db.transaction() as conn:
        await conn.execute(sessions.update().where(sessions.c.id == sid).values(**values))


async def write_request(db: Database, sid: SessionId, slots: Any) -> None:
    """Overwrite what a session's kernels ask for, on the session and on each kernel."""
    await write_row(db, sid, kernel_slots=slots)
    async with db.transaction() as conn:
        await conn.execute(
            kernels.update().where(kernels.c.session_id == sid).values(requested_slots=slots)
        )


async def isolated(world: ApiWorld, sid: SessionId) -> None:
    """The session ended ERROR with cause invalid_request, and an event says so."""
    session = await world.cluster.session(sid)
    assert session.status is S.ERROR
    async with world.cluster.db.read() as conn:
        cause, result = (
            await conn.execute(
                sa.select(sessions.c.failure_cause, sessions.c.result).where(sessions.c.id == sid)
            )
        ).one()
    assert (cause, result) == (INVALID_REQUEST, SessionResult.FAILURE.value)
    said = [
        e
        for e in await read_events(world.cluster.db, after_id=0, limit=1000)
        if e.entity_id == str(sid) and e.payload.get("to") == S.ERROR.value
    ]
    assert len(said) == 1, said


def poisons(db_url_is_sqlite: bool) -> list[Any]:
    return [NOT_AN_OBJECT, SURROGATE_SPEC] if db_url_is_sqlite else [NOT_AN_OBJECT]


@pytest.mark.parametrize(
    "kernel_slots",
    [{"cpu": 10**19}, {"cpu": 2**63}, {"cpu": "lots"}, {"cpu": 1.5}, {"cpu": -1000}],
    ids=["past-int64", "2**63", "text", "fraction", "negative"],
)
async def test_a_scheduling_pass_isolates_a_request_no_array_holds(
    world: ApiWorld, kernel_slots: dict[str, Any]
) -> None:
    """A PENDING session whose stored request does not fit the placement arrays is failed;
    another user's session in the same pass is placed."""
    poisoned = await submitted(world, world.alice)
    await write_request(world.cluster.db, poisoned, kernel_slots)
    normal = await submitted(world, world.bob)
    for sid, caller in ((poisoned, world.alice), (normal, world.bob)):
        explained = await world.http.get(f"/v1/sessions/{sid}/explain", headers=caller.headers)
        assert explained.status_code == 200, explained.text
    assert explained.json()["outcome"] == "placed"
    listed = await world.http.get("/v1/sessions", params={"reasons": "true"}, headers=admin(world))
    assert listed.status_code == 200, listed.text
    await world.cluster.run("ScheduleNewSessions")
    assert await world.cluster.status(normal) is S.PREPARING  # placed, asked to prepare
    await isolated(world, poisoned)
    await world.cluster.settle()  # and everything after it goes on
    assert await world.cluster.status(normal) is S.RUNNING


async def test_a_listing_isolates_a_row_it_cannot_show(world: ApiWorld) -> None:
    """A session whose stored spec cannot be shown is failed and listed scrubbed (no spec);
    the owner's and an admin's listings answer 200 with everyone else's sessions."""
    sqlite = world.cluster.db.dialect == "sqlite"
    poisoned = [await submitted(world, world.alice) for _ in poisons(sqlite)]
    for sid, spec in zip(poisoned, poisons(sqlite), strict=True):
        await write_row(world.cluster.db, sid, spec=spec)
    normal = await submitted(world, world.bob)
    for caller in (world.alice, world.admin):
        listed = await world.http.get("/v1/sessions", headers=caller.headers)
        assert listed.status_code == 200, listed.text
        by_id = {item["id"]: item for item in listed.json()["items"]}
        for sid in poisoned:
            shown = by_id[str(sid)]
            assert (shown["status"], shown["failure_cause"]) == ("ERROR", INVALID_REQUEST)
            assert (shown["image"], shown["command"]) == ("", [])
    assert str(normal) in by_id  # the admin's listing
    for sid in poisoned:
        await isolated(world, sid)
        one = await world.http.get(f"/v1/sessions/{sid}", headers=world.alice.headers)
        assert (one.status_code, one.json()["status"]) == (200, "ERROR"), one.text
    assert await world.cluster.status(normal) is S.PENDING


async def test_an_assignment_isolates_a_kernel_it_cannot_send(world: ApiWorld) -> None:
    """An agent whose assignment holds a session whose spec cannot be sent still gets its
    other kernels (200); that session is failed, and the next poll no longer has it."""
    admin = world.admin.headers
    made = await world.http.post("/v1/resource-groups", json={"name": "poll"}, headers=admin)
    assert made.status_code == 201, made.text
    joined = await world.http.post(
        "/v1/agents/register",
        json={
            "agent_id": "poll-agent",
            "address": "10.0.0.7",
            "resource_group": "poll",
            "slots": {"cpu": 16, "mem": "16g"},
        },
        headers={"Authorization": f"Bearer {JOIN}"},
    )
    assert joined.status_code == 201, joined.text
    agent = {"Authorization": f"Bearer {joined.json()['token']}"}
    sqlite = world.cluster.db.dialect == "sqlite"
    poisoned = [await submitted(world, world.alice, resource_group="poll") for _ in poisons(sqlite)]
    normal = await submitted(world, world.bob, resource_group="poll")
    await world.cluster.coordinator.run_all()
    assert await world.cluster.status(normal) is S.PREPARING
    for sid, spec in zip(poisoned, poisons(sqlite), strict=True):
        await write_row(world.cluster.db, sid, spec=spec)
    polled = await world.http.get("/v1/agents/poll-agent/assignments", headers=agent)
    assert polled.status_code == 200, polled.text
    assert [k["session_id"] for k in polled.json()["kernels"]] == [str(normal)]
    for sid in poisoned:
        await isolated(world, sid)
    again = await world.http.get(
        "/v1/agents/poll-agent/assignments",
        params={"since": polled.json()["revision"], "wait": 0},
        headers=agent,
    )
    assert [k["session_id"] for k in again.json()["kernels"]] == [str(normal)]


@pytest.fixture
async def refuses_terminated(world: ApiWorld) -> AsyncIterator[Any]:
    """A database trigger refusing to end one session TERMINATED: a row whose write fails."""
    db = world.cluster.db
    chosen: list[SessionId] = []

    async def poison(sid: SessionId) -> None:
        chosen.append(sid)
        async with db.transaction() as conn:
            if db.dialect == "sqlite":
                await conn.exec_driver_sql(
                    "CREATE TRIGGER poison_row BEFORE UPDATE OF status ON sessions "
                    f"WHEN NEW.id = '{sid.hex}' AND NEW.status = 'TERMINATED' "
                    "BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
                )
            else:
                await conn.exec_driver_sql(
                    "CREATE FUNCTION poison_row() RETURNS trigger AS $$ BEGIN "
                    f"IF NEW.id = '{sid}' AND NEW.status = 'TERMINATED' THEN "
                    "RAISE EXCEPTION 'poisoned row'; END IF; RETURN NEW; END $$ "
                    "LANGUAGE plpgsql"
                )
                await conn.exec_driver_sql(
                    "CREATE TRIGGER poison_row BEFORE UPDATE ON sessions "
                    "FOR EACH ROW EXECUTE FUNCTION poison_row()"
                )

    yield poison
    if chosen:
        async with db.transaction() as conn:
            await conn.exec_driver_sql("DROP TRIGGER IF EXISTS poison_row" + _on_sessions(db))
            if db.dialect == "postgresql":
                await conn.exec_driver_sql("DROP FUNCTION IF EXISTS poison_row()")


def _on_sessions(db: Database) -> str:
    return " ON sessions" if db.dialect == "postgresql" else ""


async def test_a_promotion_isolates_a_session_whose_end_cannot_be_written(
    world: ApiWorld, refuses_terminated: Any
) -> None:
    """Two sessions end in one promotion; one's row refuses its end: the other still ends
    TERMINATED (success), and the refused one is failed instead."""
    poisoned = await submitted(world, world.alice)
    normal = await submitted(world, world.bob)
    await refuses_terminated(poisoned)
    world.cluster.agent.exit_code = lambda kernel: 0  # kernels exit once started
    await world.cluster.settle()
    shown = (await world.http.get(f"/v1/sessions/{normal}", headers=world.bob.headers)).json()
    assert (shown["status"], shown["result"]) == ("TERMINATED", "success")
    await isolated(world, poisoned)


async def test_the_event_listing_leaves_out_an_event_it_cannot_send(world: ApiWorld) -> None:
    """An event whose stored payload cannot be sent is left out of the page (and the tail);
    every other event is there."""
    normal = await submitted(world, world.bob)
    bad_payloads: list[Any] = [["no", "object"]]
    if world.cluster.db.dialect == "sqlite":
        bad_payloads.append({"text": "\udc80"})
    async with world.cluster.db.transaction() as conn:
        for payload in bad_payloads:
            await conn.execute(
                events.insert().values(
                    kind="session.status_changed",
                    entity_type="session",
                    entity_id=str(normal),
                    owner_id=world.bob.user.user_id,
                    payload=payload,
                    created_at=utcnow(),
                )
            )
    await submitted(world, world.bob)
    for params in ({"follow": "false"}, {"follow": "false", "tail": "10"}):
        page = await world.http.get("/v1/events", params=params, headers=world.admin.headers)
        assert page.status_code == 200, page.text
        kinds = [item["kind"] for item in page.json()["items"]]
        assert kinds == ["session.created", "session.created"], kinds


async def test_the_agent_listing_leaves_out_an_agent_it_cannot_show(world: ApiWorld) -> None:
    """An agent whose stored labels cannot be shown is left out of the listing (logged once);
    the other agents are listed."""
    for agent_id in ("good", "bad"):
        joined = await world.http.post(
            "/v1/agents/register",
            json={"agent_id": agent_id, "address": "10.0.0.8", "slots": {"cpu": 1}},
            headers={"Authorization": f"Bearer {JOIN}"},
        )
        assert joined.status_code == 201, joined.text
    labels: Any = {"zone": "\udc80"} if world.cluster.db.dialect == "sqlite" else {"zone": 5}
    async with world.cluster.db.transaction() as conn:
        await conn.execute(agents.update().where(agents.c.id == "bad").values(labels=labels))
    listed = await world.http.get("/v1/agents", headers=world.admin.headers)
    assert listed.status_code == 200, listed.text
    shown = {item["id"] for item in listed.json()["items"]}
    assert "good" in shown and "bad" not in shown


async def test_a_scheduling_pass_isolates_a_row_whose_json_does_not_parse(
    world: ApiWorld,
) -> None:
    """SQLite keeps JSON as text: a session whose stored request is not JSON at all (written
    by hand, or by a bug) is failed by the pass that meets it (its reads see the text, no
    mapping); another user's session in the same pass is placed. (PostgreSQL refuses such
    text.)"""
    if world.cluster.db.dialect != "sqlite":
        pytest.skip("PostgreSQL's JSON columns refuse text that does not parse")
    poisoned = await submitted(world, world.alice)
    await write_request(world.cluster.db, poisoned, sa.literal_column("'{not json'"))
    normal = await submitted(world, world.bob)
    await world.cluster.run("ScheduleNewSessions")
    assert await world.cluster.status(normal) is S.PREPARING  # placed, asked to prepare
    await isolated(world, poisoned)


async def test_a_listing_and_an_assignment_get_past_a_spec_that_does_not_parse(
    world: ApiWorld,
) -> None:
    """A session whose stored spec is not JSON (SQLite): the listing and the agent's
    assignments still answer for everyone."""
    if world.cluster.db.dialect != "sqlite":
        pytest.skip("PostgreSQL's JSON columns refuse text that does not parse")
    poisoned = await submitted(world, world.alice)
    await write_row(world.cluster.db, poisoned, spec=sa.literal_column("'{not json'"))
    normal = await submitted(world, world.bob)
    listed = await world.http.get("/v1/sessions", headers=admin(world))
    assert listed.status_code == 200, listed.text
    assert str(normal) in {item["id"] for item in listed.json()["items"]}
    await world.cluster.settle()
    assert await world.cluster.status(normal) is S.RUNNING
