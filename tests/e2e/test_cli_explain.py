"""`corral explain` as a user runs it, against a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from corral.domain.session import NewSession
from corral.domain.types import AgentId, SessionId, UserId
from corral.store.agents import NewAgent, apply_slot_deltas, insert_agents
from corral.store.database import Database
from corral.store.migrate import upgrade
from corral.store.sessions import SessionRepository
from corral.store.tables import users
from tests.e2e._cli import corral


async def make_database(path: Path) -> list[SessionId]:
    """One 8-cpu agent with 4 cpu in use, a 6-cpu session at the head, a 1-cpu one behind."""
    db = Database.open(f"sqlite:///{path}")
    await upgrade(db)
    now = datetime.now(UTC)
    owner = UserId(uuid.uuid4())
    async with db.transaction() as conn:
        await conn.execute(
            users.insert(), [{"id": owner, "name": "ada", "role": "user", "created_at": now}]
        )
    node = AgentId("node-1")
    await insert_agents(db, [NewAgent(node, "10.0.0.1", {"cpu": 8000})], now)
    async with db.transaction() as conn:
        await apply_slot_deltas(conn, {node: {"cpu": 4000}})
    ids = [SessionId(uuid.uuid4()) for _ in range(2)]
    repo = SessionRepository(db)
    for age, (sid, cpu) in enumerate(zip(ids, (6000, 1000), strict=True)):
        await repo.insert(
            [
                NewSession(
                    id=sid,
                    owner_id=owner,
                    type="BATCH",
                    resource_group="default",
                    cluster_mode="single-node",
                    cluster_size=1,
                    spec={"image": "python", "command": ["true"]},
                    kernel_slots={"cpu": cpu},
                    name="big" if cpu > 4000 else "small",
                )
            ],
            now + timedelta(seconds=age),  # the big one is older: first in FIFO order
        )
    await db.close()
    return ids


def test_explain_names_the_blocking_session_and_the_shortage(tmp_path: Path) -> None:
    """The head waits for capacity; the session behind it is blocked and told by whom."""
    path = tmp_path / "corral.db"
    big, small = asyncio.run(make_database(path))
    env = {**os.environ, "CORRAL_DATABASE_URL": f"sqlite:///{path}"}

    head = corral("explain", str(big), "--json", env=env)
    assert head.returncode == 0, head.stderr
    head_json = json.loads(head.stdout)
    assert (head_json["outcome"], head_json["code"], head_json["position"]) == (
        "waiting",
        "no_capacity",
        1,
    )

    behind = corral("explain", str(small), env=env)
    assert behind.returncode == 0, behind.stderr
    assert "position 2 of 2" in behind.stdout
    assert "waiting behind session big" in behind.stdout


def test_explain_unknown_or_malformed_session_is_a_clear_error(tmp_path: Path) -> None:
    """A malformed id exits 2 naming the argument; an unknown id exits 1; no traceback."""
    path = tmp_path / "corral.db"
    asyncio.run(make_database(path))
    env = {**os.environ, "CORRAL_DATABASE_URL": f"sqlite:///{path}"}
    malformed = corral("explain", "not-a-uuid", env=env)
    assert malformed.returncode == 2 and "is not a session id" in malformed.stderr
    unknown = corral("explain", str(uuid.uuid4()), env=env)
    assert unknown.returncode == 1 and "no session" in unknown.stderr
    assert "Traceback" not in malformed.stderr + unknown.stderr
