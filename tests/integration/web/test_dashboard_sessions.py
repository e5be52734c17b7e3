"""The dashboard's sign-in session over HTTP, on SQLite and PostgreSQL: the cookie holds a
server-side session's secret, never the API token; sign-out, a revoked token, a removed user
and time end it; actions still need the CSRF token."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import sqlalchemy as sa

from corral.store.dashboard_sessions import SECRET_PREFIX
from corral.store.tables import dashboard_sessions
from corral.store.users import issue_token
from corral.web.auth import COOKIE, CSRF_FIELD, SESSION_LIFETIME
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.web.test_dashboard import csrf_of, sign_in, token_of


def _secret(cookies: dict[str, str]) -> str:
    return cookies["Cookie"].split("=", 1)[1]


async def test_the_cookie_holds_a_session_secret_not_the_token(world: ApiWorld) -> None:
    """The cookie is a random secret (not the token, nor anything derived from it); the
    database keeps only its hash, bound to the user; each sign-in opens its own session."""
    token = token_of(world.alice)
    first = await sign_in(world, world.alice)
    second = await sign_in(world, world.alice)
    for cookies in (first, second):
        secret = _secret(cookies)
        assert secret.startswith(SECRET_PREFIX)
        assert token not in cookies["Cookie"]
        assert hashlib.sha256(token.encode()).hexdigest() not in cookies["Cookie"]
    assert _secret(first) != _secret(second)
    async with world.cluster.db.read() as conn:
        rows = (await conn.execute(sa.select(dashboard_sessions))).all()
    assert {r.user_id for r in rows} == {world.alice.user.user_id}
    assert {r.secret_hash for r in rows} == {
        hashlib.sha256(_secret(c).encode()).hexdigest() for c in (first, second)
    }
    page = await world.http.get("/ui/sessions", headers=first)
    assert page.status_code == 200 and "alice" in page.text
    assert token not in page.text


async def test_sign_out_ends_the_session_on_the_server(world: ApiWorld) -> None:
    """After sign-out (with the CSRF token) the same cookie, replayed, is refused: pages go to
    sign-in, the stream and actions answer 401. Another session of the user stays."""
    alice = await sign_in(world, world.alice)
    other = await sign_in(world, world.alice)
    refused = await world.http.post("/ui/sign-out", headers=alice)
    assert refused.status_code == 403  # no CSRF token: still signed in
    assert (await world.http.get("/ui", headers=alice)).status_code == 200
    answer = await world.http.post("/ui/sign-out", data={CSRF_FIELD: csrf_of(alice)}, headers=alice)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/sign-in"
    cleared = answer.headers["set-cookie"].lower()
    assert f'{COOKIE}=""' in cleared or "max-age=0" in cleared
    replayed = await world.http.get("/ui/sessions", headers=alice)
    assert replayed.status_code == 303
    assert replayed.headers["location"].startswith("/ui/sign-in")
    assert (await world.http.get("/ui/stream", headers=alice)).status_code == 401
    again = await world.http.post("/ui/sign-out", data={CSRF_FIELD: csrf_of(alice)}, headers=alice)
    assert again.status_code == 401
    assert (await world.http.get("/ui", headers=other)).status_code == 200


async def _revoke_all(world: ApiWorld, caller: Caller) -> None:
    listed = await world.http.get(
        f"/v1/users/{caller.user.name}/tokens", headers=world.admin.headers
    )
    assert listed.status_code == 200, listed.text
    for item in listed.json()["items"]:
        done = await world.http.delete(f"/v1/tokens/{item['id']}", headers=world.admin.headers)
        assert done.status_code in (200, 204), done.text


async def test_a_revoked_tokens_dashboard_session_is_refused(world: ApiWorld) -> None:
    """Revoking the token that signed in ends its dashboard sessions at once: the page goes to
    sign-in, an action with the right CSRF token is 401, the stream is 401."""
    bob = await sign_in(world, world.bob)
    assert (await world.http.get("/ui/sessions", headers=bob)).status_code == 200
    await _revoke_all(world, world.bob)
    page = await world.http.get("/ui/sessions", headers=bob)
    assert page.status_code == 303
    assert page.headers["location"].startswith("/ui/sign-in")
    agent = next(iter(world.cluster.agents))
    action = await world.http.post(
        f"/ui/agents/{agent}/drain", data={CSRF_FIELD: csrf_of(bob)}, headers=bob
    )
    assert action.status_code == 401
    assert (await world.http.get("/ui/stream", headers=bob)).status_code == 401
    async with world.cluster.db.read() as conn:
        left = await conn.scalar(
            sa.select(sa.func.count())
            .select_from(dashboard_sessions)
            .where(dashboard_sessions.c.user_id == world.bob.user.user_id)
        )
    assert left == 0


async def test_a_removed_users_dashboard_session_is_refused(world: ApiWorld) -> None:
    """Removing a user ends their dashboard sessions."""
    bob = await sign_in(world, world.bob)
    removed = await world.http.delete("/v1/users/bob", headers=world.admin.headers)
    assert removed.status_code in (200, 204), removed.text
    page = await world.http.get("/ui", headers=bob)
    assert page.status_code == 303


async def test_a_dashboard_session_expires(world: ApiWorld) -> None:
    """A session older than its lifetime is refused (by the manager's clock), and the cookie
    says as much with its Max-Age."""
    answer = await world.http.post("/ui/sign-in", data={"token": token_of(world.alice)})
    assert (
        f"max-age={int(SESSION_LIFETIME.total_seconds())}" in answer.headers["set-cookie"].lower()
    )
    world.http.cookies.clear()
    alice = {"Cookie": f"{COOKIE}={answer.cookies[COOKIE]}"}
    world.cluster.clock.advance(SESSION_LIFETIME.total_seconds() - 1)
    assert (await world.http.get("/ui", headers=alice)).status_code == 200
    world.cluster.clock.advance(2)
    assert (await world.http.get("/ui", headers=alice)).status_code == 303


async def test_a_forged_or_token_valued_cookie_is_refused(world: ApiWorld) -> None:
    """The API token itself in the cookie (the old form) signs no one in, nor a made-up secret."""
    for value in (token_of(world.admin), SECRET_PREFIX + "forged"):
        page = await world.http.get("/ui", headers={"Cookie": f"{COOKIE}={value}"})
        assert page.status_code == 303, value


async def test_a_dashboard_session_ends_with_its_tokens_expiry(world: ApiWorld) -> None:
    """Signed in with a token that expires in an hour, the dashboard session ends then, not
    after its own 12 hours."""
    now = world.cluster.clock()
    short = await issue_token(
        world.cluster.db, world.alice.user.user_id, "short", now, now + timedelta(hours=1)
    )
    answer = await world.http.post("/ui/sign-in", data={"token": short.secret})
    assert answer.status_code == 303
    world.http.cookies.clear()
    alice = {"Cookie": f"{COOKIE}={answer.cookies[COOKIE]}"}
    world.cluster.clock.advance(3600 - 1)
    assert (await world.http.get("/ui", headers=alice)).status_code == 200
    world.cluster.clock.advance(2)
    assert (await world.http.get("/ui", headers=alice)).status_code == 303
