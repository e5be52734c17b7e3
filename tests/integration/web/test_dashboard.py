"""The dashboard at /ui over HTTP (the real app in-process), on SQLite and PostgreSQL: sign-in,
the cookie, CSRF on actions, and isolation enforced on the server."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from corral.domain.status import SessionStatus
from corral.web import pages, session_pages
from corral.web.auth import COOKIE, CSRF_FIELD, csrf_token
from tests.integration.api.conftest import ApiWorld, Caller
from tests.integration.store._factories import add_agents

BODY = {"image": "python", "command": ["python", "-c", "print(1)"], "resources": {"cpu": 1}}
PAGES = ("/ui", "/ui/queue", "/ui/sessions", "/ui/agents", "/ui/events")


def token_of(caller: Caller) -> str:
    return caller.headers["Authorization"].removeprefix("Bearer ")


async def submit(world: ApiWorld, caller: Caller, **fields: Any) -> dict[str, Any]:
    answer = await world.http.post("/v1/sessions", json={**BODY, **fields}, headers=caller.headers)
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def sign_in(world: ApiWorld, caller: Caller) -> dict[str, str]:
    """Sign in through the form; the header of the cookie the browser would keep."""
    answer = await world.http.post(
        "/ui/sign-in", data={"token": token_of(caller), "next": "/ui/sessions"}
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/ui/sessions"
    world.http.cookies.clear()
    return {"Cookie": f"{COOKIE}={answer.cookies[COOKIE]}"}


def csrf_of(cookies: dict[str, str]) -> str:
    """The CSRF token a page of this signed-in browser carries."""
    return csrf_token(cookies["Cookie"].split("=", 1)[1])


async def test_sign_in_sets_an_httponly_samesite_cookie(world: ApiWorld) -> None:
    """A valid token gives an HttpOnly, SameSite=Strict cookie scoped to /ui; a bad one does not."""
    answer = await world.http.post("/ui/sign-in", data={"token": token_of(world.alice)})
    header = answer.headers["set-cookie"].lower()
    assert answer.status_code == 303
    assert "httponly" in header and "samesite=strict" in header and "path=/ui" in header
    world.http.cookies.clear()
    refused = await world.http.post("/ui/sign-in", data={"token": "crl_forged"})
    assert refused.status_code == 401
    assert "set-cookie" not in refused.headers
    assert "unknown" in refused.text


async def test_sign_in_from_another_site_is_refused(world: ApiWorld) -> None:
    """A sign-in form posted from another origin sets no cookie (login CSRF)."""
    answer = await world.http.post(
        "/ui/sign-in",
        data={"token": token_of(world.alice)},
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403
    assert "set-cookie" not in answer.headers
    same = await world.http.post(
        "/ui/sign-in", data={"token": token_of(world.alice)}, headers={"Origin": "http://manager"}
    )
    assert same.status_code == 303


async def test_pages_without_a_cookie_go_to_sign_in(world: ApiWorld) -> None:
    """Every page sends a browser without a cookie to the sign-in page, and back after."""
    for path in (*PAGES, "/ui/sessions/1"):
        answer = await world.http.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/ui/sign-in?next=" + path)
    assert (await world.http.get("/ui/stream")).status_code == 401


async def test_every_page_renders_for_a_signed_in_user(world: ApiWorld) -> None:
    """Each page answers 200 HTML with the security headers and the user's name."""
    await submit(world, world.alice, name="train")
    cookies = await sign_in(world, world.admin)
    for path in PAGES:
        answer = await world.http.get(path, headers=cookies)
        assert answer.status_code == 200, (path, answer.text)
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        assert "root (admin)" in answer.text
    table = await world.http.get("/ui/sessions?name=tr", headers=cookies)
    assert "train" in table.text and "alice" in table.text
    assert "train" not in (await world.http.get("/ui/sessions?name=x", headers=cookies)).text


async def test_a_user_sees_only_their_own_sessions(world: ApiWorld) -> None:
    """Bob's pages never show Alice's session: not in the table, queue or overview, and its
    page by URL is 'no such session'; the admin sees it."""
    mine = await submit(world, world.alice, name="alice-secret")
    bob = await sign_in(world, world.bob)
    for path in PAGES:
        answer = await world.http.get(path, headers=bob)
        assert "alice-secret" not in answer.text, path
        assert mine["id"] not in answer.text, path
    for ref in (mine["id"], str(mine["number"]), "alice-secret"):
        page = await world.http.get(f"/ui/sessions/{ref}", headers=bob)
        assert page.status_code == 404, ref
        assert "No such session" in page.text
        assert 'id="session-status"' not in page.text
    log = await world.http.get(f"/ui/sessions/{mine['id']}/log", headers=bob)
    assert log.status_code == 404
    admin = await sign_in(world, world.admin)
    assert (
        "alice-secret" in (await world.http.get(f"/ui/sessions/{mine['id']}", headers=admin)).text
    )
    alice = await sign_in(world, world.alice)
    queue = await world.http.get("/ui/queue", headers=alice)
    assert "alice-secret" in queue.text


async def test_terminate_needs_the_csrf_token(world: ApiWorld) -> None:
    """Terminate without the CSRF token (or with another user's) is refused and changes
    nothing; with the page's token it cancels the pending session."""
    mine = await submit(world, world.alice)
    alice = await sign_in(world, world.alice)
    url = f"/ui/sessions/{mine['id']}/terminate"
    bob = await sign_in(world, world.bob)
    for sent in ({}, {CSRF_FIELD: "nope"}, {CSRF_FIELD: csrf_of(bob)}):
        refused = await world.http.post(url, data=sent, headers=alice)
        assert refused.status_code == 403, refused.text
        assert refused.json()["type"].endswith("/csrf-token-invalid")
    page = await world.http.get(f"/ui/sessions/{mine['id']}", headers=alice)
    assert 'data-status="PENDING"' in page.text
    shown = re.search(rf'name="{CSRF_FIELD}" value="([0-9a-f]+)"', page.text)
    assert shown is not None
    done = await world.http.post(url, data={CSRF_FIELD: shown.group(1)}, headers=alice)
    assert done.status_code == 303
    after = await world.http.get(done.headers["location"], headers=alice)
    assert f'data-status="{SessionStatus.CANCELLED.value}"' in after.text


async def test_another_users_session_cannot_be_terminated_from_the_page(world: ApiWorld) -> None:
    """Bob, with his own valid CSRF token, cannot terminate Alice's session (404)."""
    mine = await submit(world, world.alice)
    bob = await sign_in(world, world.bob)
    answer = await world.http.post(
        f"/ui/sessions/{mine['id']}/terminate",
        data={CSRF_FIELD: csrf_of(bob)},
        headers=bob,
    )
    assert answer.status_code == 404
    status = await world.http.get(f"/v1/sessions/{mine['id']}", headers=world.alice.headers)
    assert status.json()["status"] == SessionStatus.PENDING.value


async def test_drain_is_for_admins_and_needs_csrf(world: ApiWorld) -> None:
    """A plain user cannot drain an agent; an admin can, with the CSRF token."""
    agent = next(iter(world.cluster.agents))
    bob = await sign_in(world, world.bob)
    refused = await world.http.post(
        f"/ui/agents/{agent}/drain", data={CSRF_FIELD: csrf_of(bob)}, headers=bob
    )
    assert refused.status_code == 403
    admin = await sign_in(world, world.admin)
    assert (await world.http.post(f"/ui/agents/{agent}/drain", headers=admin)).status_code == 403
    done = await world.http.post(
        f"/ui/agents/{agent}/drain",
        data={CSRF_FIELD: csrf_of(admin)},
        headers=admin,
    )
    assert done.status_code == 303
    assert "DRAINED" in (await world.http.get("/ui/agents", headers=admin)).text


async def test_overview_shows_capacity_counts_and_activity(world: ApiWorld) -> None:
    """After a one-cpu session is placed on the 8-cpu agent, the overview shows 1 / 8 cpu used,
    the session in its status count, and one start in the last hour's chart."""
    await submit(world, world.alice)
    await world.cluster.settle()
    status = (await world.http.get("/v1/sessions", headers=world.alice.headers)).json()
    shown = status["items"][0]["status"]
    alice = await sign_in(world, world.alice)
    page = (await world.http.get("/ui", headers=alice)).text
    assert "1 / 8 cpu" in page and "12% used" in page
    assert f'data-count="{shown}">1<' in page
    assert "1 started" in page
    bob = await sign_in(world, world.bob)
    assert f'data-count="{shown}">0<' in (await world.http.get("/ui", headers=bob)).text


async def test_the_session_table_filters_pages_and_names_a_bad_filter(
    world: ApiWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin filters by owner; pages follow the cursor, newest first; an unknown status is
    a 422 page naming the field."""
    monkeypatch.setattr(session_pages, "PAGE_SIZE", 1)
    await submit(world, world.alice, name="older")
    await submit(world, world.bob, name="newer")
    admin = await sign_in(world, world.admin)
    first = (await world.http.get("/ui/sessions", headers=admin)).text
    assert "newer" in first and "older" not in first
    older = re.search(r'href="\?([^"]*cursor=[^"]+)" rel="next"', first)
    assert older is not None
    second = await world.http.get(f"/ui/sessions?{html.unescape(older.group(1))}", headers=admin)
    assert "older" in second.text and "newer" not in second.text
    bobs = (await world.http.get("/ui/sessions?owner=bob", headers=admin)).text
    assert "newer" in bobs
    assert "older" not in (await world.http.get("/ui/sessions?owner=bob", headers=admin)).text
    bad = await world.http.get("/ui/sessions?status=SLEEPING", headers=admin)
    assert bad.status_code == 422
    assert "status: no status" in html.unescape(bad.text)


async def test_dashboards_share_a_fresh_read_but_a_refresh_sees_its_event(world: ApiWorld) -> None:
    """Two dashboards loading the queue within a second share one read (the second page says
    the first read's event id, so its stream brings what came after). A refresh for a newer
    event (`?seen=`, what corral.js sends) is never given the read from before it: the session
    that event created is on the page."""
    assert world.app is not None
    clock = _Clock()
    world.app.state.shared_reads.clock = clock  # a second passes only when the test says
    first = await submit(world, world.alice, name="first-job")
    alice = await sign_in(world, world.alice)
    one = await world.http.get("/ui/queue", headers=alice)
    since = _since(one)
    later = await submit(world, world.alice, name="later-job")
    shared = await world.http.get("/ui/queue", headers=alice)
    assert "later-job" not in shared.text  # the read of a moment ago, shared
    assert f'data-since="{since}"' in shared.text  # so the stream replays what came after
    # The newest event, as the stream would bring it: the sessions page (never shared) says it.
    newest = _since(await world.http.get("/ui/sessions", headers=alice))
    assert newest > since
    refreshed = await world.http.get("/ui/queue", params={"seen": newest}, headers=alice)
    assert "later-job" in refreshed.text and "first-job" in refreshed.text
    assert first["id"] != later["id"]
    clock.now += 1.5  # and past a second, a page reads afresh anyway
    assert "later-job" in (await world.http.get("/ui/queue", headers=alice)).text


def _since(page: Any) -> int:
    """The event id a page says it was rendered after (its stream starts there)."""
    found = re.search(r'data-since="(\d+)"', page.text)
    assert found is not None
    return int(found.group(1))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_agents_page_shows_a_page_at_a_time_by_id(world: ApiWorld) -> None:
    """With more agents than a page holds, the page says which of how many it shows and links
    the next page; the pages together show every agent once, in id order."""
    await add_agents(world.cluster.db, [{"cpu": 1000}] * (pages.AGENTS_SHOWN + 5))
    admin = await sign_in(world, world.admin)
    first = await world.http.get("/ui/agents", headers=admin)
    total = pages.AGENTS_SHOWN + 5 + len(world.cluster.agents)
    assert f"Agents 1 to {pages.AGENTS_SHOWN} of {total}, by id." in first.text
    seen = re.findall(r'<tr data-agent="([^"]+)"', first.text)
    following = re.search(r'href="/ui/agents\?after=([^"]+)"', first.text)
    assert following is not None
    second = await world.http.get(
        "/ui/agents", params={"after": html.unescape(following.group(1))}, headers=admin
    )
    assert f"of {total}, by id." in second.text and 'href="/ui/agents">First<' in second.text
    assert "after=" not in second.text  # the last page links no next one
    seen += re.findall(r'<tr data-agent="([^"]+)"', second.text)
    assert len(seen) == len(set(seen)) == total
    assert seen == sorted(seen)
