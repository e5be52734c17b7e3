"""The events table on both backends: batched appends in the caller's transaction, paging."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from corral.domain.events import Event
from corral.store.database import Database
from corral.store.events import EventNotice, append_events, read_events, read_noticed_events

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def event(n: int, *, owner: uuid.UUID | None = None, entity_id: str = "s-1") -> Event:
    """A session event numbered `n` (in its payload)."""
    return Event(
        kind="session.status_changed",
        entity_type="session",
        entity_id=entity_id,
        owner_id=owner,
        payload={"n": n},
        created_at=NOW,
    )


async def append(db: Database, events: list[Event], now: datetime = NOW) -> list[Event]:
    """Append `events` in a transaction of their own."""
    async with db.transaction() as conn:
        return await append_events(conn, events, now)


async def test_append_returns_ids_in_order_and_read_returns_the_same_events(db: Database) -> None:
    """One append gives increasing ids in input order; reading gives back equal events."""
    later = NOW + timedelta(seconds=5)
    appended = await append(db, [event(n) for n in range(50)], later)
    ids = [e.id or 0 for e in appended]
    assert all(ids) and ids == sorted(ids) and len(set(ids)) == 50
    assert [e.payload["n"] for e in appended] == list(range(50))
    assert all(e.created_at == later for e in appended)
    assert await read_events(db) == appended


async def test_append_nothing_writes_nothing(db: Database) -> None:
    """Appending an empty batch returns [] and stores nothing."""
    assert await append(db, []) == []
    assert await read_events(db) == []


async def test_rolled_back_transaction_stores_no_events(db: Database) -> None:
    """Events appended in a transaction that rolls back are gone with it."""

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with db.transaction() as conn:
            assert len(await append_events(conn, [event(1), event(2)], NOW)) == 2
            raise Abort
    assert await read_events(db) == []


async def test_after_id_pages_through_the_log_oldest_first(db: Database) -> None:
    """Pages of `limit` events, each starting after the last id of the previous one."""
    appended = await append(db, [event(n) for n in range(7)])
    await append(db, [event(n) for n in range(7, 10)])
    pages: list[list[Event]] = []
    after = 0
    while page := await read_events(db, after_id=after, limit=3):
        pages.append(page)
        assert page[-1].id is not None
        after = page[-1].id
    assert [len(p) for p in pages] == [3, 3, 3, 1]
    assert [e.payload["n"] for p in pages for e in p] == list(range(10))
    assert await read_events(db, after_id=appended[-1].id or 0) == pages[-2][1:] + pages[-1]


async def test_owner_and_entity_filters(db: Database) -> None:
    """owner_id keeps only that owner's events; entity_id keeps only that entity's events."""
    alice, bob = uuid.uuid4(), uuid.uuid4()
    await append(
        db,
        [
            event(0, owner=alice),
            event(1, owner=bob),
            event(2),
            event(3, owner=alice, entity_id="s-2"),
        ],
    )
    assert [e.payload["n"] for e in await read_events(db, owner_id=alice)] == [0, 3]
    assert [e.owner_id for e in await read_events(db, owner_id=bob)] == [bob]
    assert [e.payload["n"] for e in await read_events(db, entity_id="s-2")] == [3]
    assert await read_events(db, owner_id=bob, entity_id="s-2") == []
    assert len(await read_events(db)) == 4


async def test_payload_round_trips_as_json(db: Database) -> None:
    """Nested payloads come back equal; datetimes and UUIDs come back as ISO text and strings."""
    stamp = datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)
    owner = uuid.uuid4()
    payload = {
        "status": {"from": "PENDING", "to": "SCHEDULED"},
        "kernels": [{"index": 0, "agent": "a-1", "slots": {"cpu": 1000}}, None, 1.5, True],
        "at": stamp,
        "who": owner,
        "empty": {},
    }
    [appended] = await append(db, [dataclasses.replace(event(0), payload=payload)])
    expected = {**payload, "at": stamp.isoformat(), "who": str(owner)}
    assert appended.payload == expected
    [read] = await read_events(db)
    assert read.payload == expected
    assert datetime.fromisoformat(read.payload["at"]) == stamp
    assert read.created_at == NOW and read.created_at.tzinfo is not None
    assert Event.from_json(read.to_json()) == read


@pytest.mark.postgres
async def test_noticed_events_are_read_by_their_runs_of_ids(postgres_database_url: str) -> None:
    """PostgreSQL: the events in any run of a notice, by id; ids without a row are left out."""
    db = Database.open(postgres_database_url)
    try:
        appended = await append(db, [event(n) for n in range(6)])
        ids = [e.id or 0 for e in appended]
        notices = [
            EventNotice(((ids[0], ids[1]), (ids[3], ids[3])), None),
            EventNotice(((ids[5], ids[5] + 10),), frozenset({"session.status_changed"})),
        ]
        found = await read_noticed_events(db, notices)
    finally:
        await db.close()
    assert found == {e.id: e for e in (appended[0], appended[1], appended[3], appended[5])}


async def test_events_sharing_a_payload_object_each_store_their_own(db: Database) -> None:
    """Events that share one payload object (a batch of alike moves) and events with their
    own payloads, interleaved, each read back with the right payload."""
    shared: dict[str, object] = {"from": "CREATING", "to": "RUNNING", "reason": "r"}
    batch = [
        dataclasses.replace(event(0), payload=shared),
        event(1),
        dataclasses.replace(event(0), payload=shared, entity_id="s-2"),
        event(2),
    ]
    appended = await append(db, batch)
    assert [e.payload for e in await read_events(db)] == [shared, {"n": 1}, shared, {"n": 2}]
    assert [e.payload for e in appended] == [shared, {"n": 1}, shared, {"n": 2}]
