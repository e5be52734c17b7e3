"""Tokens (each user's own, admins' anyone's; expiry and its default), users' roles and
removal, agents' removal: over HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from corral.api import auth
from corral.domain.tokens import DEFAULT_TOKEN_TTL_S
from corral.domain.types import AgentId, utcnow
from corral.store.agent_registry import deregister_agent
from corral.store.users import issue_token
from tests.integration.api.conftest import ApiWorld
from tests.integration.api.test_sessions_api import create, problem


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def _make_token(world: ApiWorld, user: str, headers: dict[str, str], **body: Any) -> Any:
    return await world.http.post(
        f"/v1/users/{user}/tokens", json={"name": "laptop", **body}, headers=headers
    )


async def test_users_make_list_and_revoke_their_own_tokens(world: ApiWorld) -> None:
    """A token made without an expiry lasts the manager's default; its secret works at once,
    is never listed, and stops working once revoked."""
    made = await _make_token(world, "alice", world.alice.headers)
    assert made.status_code == 201, made.text
    token = made.json()
    created, expires = (datetime.fromisoformat(token[k]) for k in ("created_at", "expires_at"))
    assert expires - created == timedelta(seconds=DEFAULT_TOKEN_TTL_S)
    me = await world.http.get("/v1/me", headers=_bearer(token["token"]))
    assert me.json()["name"] == "alice"

    listed = await world.http.get("/v1/users/alice/tokens", headers=world.alice.headers)
    assert sorted(t["name"] for t in listed.json()["items"]) == ["laptop", "test"]
    assert all("token" not in t for t in listed.json()["items"])

    revoked = await world.http.delete(f"/v1/tokens/{token['id']}", headers=world.alice.headers)
    assert revoked.status_code == 204
    gone = await world.http.get("/v1/me", headers=_bearer(token["token"]))
    assert problem(gone, 401, "unauthenticated")


@pytest.mark.parametrize(
    ("body", "lasts"),
    [
        ({"expires_in_s": 3600}, timedelta(hours=1)),
        ({"expires_in_s": None}, None),
    ],
)
async def test_a_token_may_name_its_lifetime_or_never_expire(
    world: ApiWorld, body: dict[str, Any], lasts: timedelta | None
) -> None:
    """`expires_in_s` overrides the default; null makes a token that never expires."""
    token = (await _make_token(world, "bob", world.bob.headers, **body)).json()
    if lasts is None:
        assert token["expires_at"] is None
    else:
        created, expires = (datetime.fromisoformat(token[k]) for k in ("created_at", "expires_at"))
        assert expires - created == lasts


async def test_other_users_tokens_are_an_admins_business(world: ApiWorld) -> None:
    """Alice may not list, make or revoke Bob's tokens (403, and 404 for his token's id, as if
    it did not exist); an admin may do all three."""
    bobs = (await _make_token(world, "bob", world.bob.headers)).json()
    for response in (
        await world.http.get("/v1/users/bob/tokens", headers=world.alice.headers),
        await _make_token(world, "bob", world.alice.headers),
    ):
        assert "may manage only your own tokens" in problem(response, 403, "forbidden")["detail"]
    refused = await world.http.delete(f"/v1/tokens/{bobs['id']}", headers=world.alice.headers)
    assert problem(refused, 404, "token-not-found")
    assert (await world.http.get("/v1/me", headers=_bearer(bobs["token"]))).status_code == 200

    listed = await world.http.get("/v1/users/bob/tokens", headers=world.admin.headers)
    assert len(listed.json()["items"]) == 2
    assert (await _make_token(world, "bob", world.admin.headers)).status_code == 201
    revoked = await world.http.delete(f"/v1/tokens/{bobs['id']}", headers=world.admin.headers)
    assert revoked.status_code == 204


async def test_an_expired_token_is_refused_saying_so(
    world: ApiWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its expiry a token answers 401 token-expired, even while this manager holds it in
    its cache from a request a moment before."""
    now = utcnow()
    stale = await issue_token(world.cluster.db, world.bob.user.user_id, "old", now, now)
    body = problem(
        await world.http.get("/v1/me", headers=_bearer(stale.secret)), 401, "token-expired"
    )
    assert body["detail"].startswith("the token expired at ")

    fresh = await issue_token(
        world.cluster.db, world.bob.user.user_id, "soon", now, now + timedelta(hours=1)
    )
    assert (await world.http.get("/v1/me", headers=_bearer(fresh.secret))).status_code == 200
    monkeypatch.setattr(auth, "utcnow", lambda: now + timedelta(hours=2))
    late = await world.http.get("/v1/me", headers=_bearer(fresh.secret))
    assert problem(late, 401, "token-expired")


async def test_an_admin_changes_roles_but_never_removes_the_last_admin(world: ApiWorld) -> None:
    """Bob made an admin can list users; the only admin can neither step down nor be removed."""
    last = await world.http.patch(
        "/v1/users/root", json={"role": "user"}, headers=world.admin.headers
    )
    assert "'root' is the only admin" in problem(last, 409, "last-admin")["detail"]
    assert problem(
        await world.http.delete("/v1/users/root", headers=world.admin.headers), 409, "last-admin"
    )

    promoted = await world.http.patch(
        "/v1/users/bob", json={"role": "admin"}, headers=world.admin.headers
    )
    assert promoted.json()["role"] == "admin"
    assert (await world.http.get("/v1/users", headers=world.bob.headers)).status_code == 200
    stepped_down = await world.http.patch(
        "/v1/users/root", json={"role": "user"}, headers=world.bob.headers
    )
    assert stepped_down.json()["role"] == "user"
    no_longer = await world.http.get("/v1/users", headers=world.admin.headers)
    assert problem(no_longer, 403, "forbidden")


async def test_a_user_is_removed_with_their_tokens_once_they_own_no_session(
    world: ApiWorld,
) -> None:
    """Alice owns a session: 409 naming it, nothing removed; Bob owns none: removed, taken off
    the groups' users, and his token is refused at once."""
    assert (await create(world, world.alice)).status_code == 201
    refused = await world.http.delete("/v1/users/alice", headers=world.admin.headers)
    body = problem(refused, 409, "user-has-sessions")
    assert (body["sessions"], body["active_sessions"]) == (1, 1)
    assert "terminate the active ones" in body["detail"]

    listed = await world.http.patch(
        "/v1/resource-groups/default",
        json={"options": {"allowed_users": ["alice", "bob"]}},
        headers=world.admin.headers,
    )
    assert listed.status_code == 200, listed.text
    removed = await world.http.delete("/v1/users/bob", headers=world.admin.headers)
    assert removed.status_code == 204
    group = await world.http.get("/v1/resource-groups/default", headers=world.admin.headers)
    assert group.json()["options"]["allowed_users"] == ["alice"]  # no later 'bob' inherits it
    assert problem(
        await world.http.get("/v1/me", headers=world.bob.headers), 401, "unauthenticated"
    )
    names = [
        u["name"]
        for u in (await world.http.get("/v1/users", headers=world.admin.headers)).json()["items"]
    ]
    assert "bob" not in names and {"alice", "root"} <= set(names)
    gone = await world.http.delete("/v1/users/bob", headers=world.admin.headers)
    assert problem(gone, 404, "user-not-found")


async def test_an_agent_is_removed_only_once_it_left(world: ApiWorld) -> None:
    """An ALIVE agent is refused (409 agent-in-use); once it left cleanly it is removed, and
    is gone from the listing."""
    (agent_id,) = world.cluster.agents
    alive = await world.http.delete(f"/v1/agents/{agent_id}", headers=world.admin.headers)
    assert "is ALIVE" in problem(alive, 409, "agent-in-use")["detail"]
    assert await deregister_agent(world.cluster.db, AgentId(agent_id), utcnow())
    removed = await world.http.delete(f"/v1/agents/{agent_id}", headers=world.admin.headers)
    assert removed.status_code == 204
    listed = await world.http.get("/v1/agents", headers=world.admin.headers)
    assert listed.json()["items"] == []
    again = await world.http.delete(f"/v1/agents/{agent_id}", headers=world.admin.headers)
    assert problem(again, 404, "agent-not-found")
