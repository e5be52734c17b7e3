"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright, against
`corral up` (a real manager and a local process agent), as a user opens it.

With `CORRAL_DASHBOARD_SCREENSHOTS=<dir>` the tests also save the main pages' screenshots there
(`docs/dashboard/` holds the ones the README shows).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.web.auth import CSRF_FIELD
from tests.conftest import IN_CI
from tests.e2e._up import Up, start_up

CHROMIUM = os.environ.get("CORRAL_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 30_000  # for what the page shows to change: sessions start in well under a second
SCREENSHOTS = os.environ.get("CORRAL_DASHBOARD_SCREENSHOTS")
LONG = "import time; print('hello from the dashboard test', flush=True); time.sleep(300)"


def _browser_missing() -> str | None:
    if shutil.which(CHROMIUM) is None:
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"the playwright package is missing: {exc}"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium, or a skip (a failure in CI) where there is none."""
    missing = _browser_missing()
    if missing is not None:
        if IN_CI:
            pytest.fail(f"the dashboard's browser tests need chromium in CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    yield from start_up(tmp_path_factory.mktemp("up"))


@pytest.fixture(scope="module")
def api(up: Up) -> Iterator[httpx.Client]:
    """The API as the admin `corral up` printed calls it."""
    url = up.said_after("corral is up at ")
    token = up.said_after("admin token: ")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


def _signed_in(browser: Any, api: httpx.Client, token: str, width: int = 1280) -> Any:
    """A new browser page, signed in through the sign-in form with `token`."""
    context = browser.new_context(
        base_url=str(api.base_url), viewport={"width": width, "height": 900}
    )
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto("/ui/sessions")
    assert "/ui/sign-in" in page.url
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/sessions")
    return page


def _admin_token(api: httpx.Client) -> str:
    return api.headers["Authorization"].removeprefix("Bearer ")


def _submit(api: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"image": "python", "command": ["python", "-c", LONG], "resources": {"cpu": 0.1}}
    answer = api.post("/v1/sessions", json=body | fields)
    assert answer.status_code == 201, answer.text
    found: dict[str, Any] = answer.json()
    return found


def _wait_running(api: httpx.Client, session_id: str) -> None:
    deadline = time.monotonic() + WAIT_MS / 1000
    while (status := api.get(f"/v1/sessions/{session_id}").json()["status"]) != "RUNNING":
        assert time.monotonic() < deadline, f"still {status}"
        time.sleep(0.05)


def _shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def test_a_session_shows_up_live_runs_logs_and_is_terminated_from_its_page(
    browser: Any, api: httpx.Client
) -> None:
    """Submitted through the API, a session appears on the open sessions page and turns
    RUNNING without a reload; its page tails its output; Terminate there ends it."""
    page = _signed_in(browser, api, _admin_token(api))
    page.wait_for_selector("#live-state[data-state=on]")
    page.evaluate("window.notReloaded = true")
    session = _submit(api, name="live-one")
    row = page.locator(f"tr[data-session='{session['id']}']")
    row.locator("[data-status=RUNNING]").wait_for()
    assert page.evaluate("window.notReloaded") is True
    _shot(page, "sessions")
    row.locator("a").first.click()
    page.wait_for_url(f"**/ui/sessions/{session['id']}")
    page.locator("#log", has_text="hello from the dashboard test").wait_for()
    _shot(page, "session")
    page.evaluate("window.notReloaded = true")
    page.click("#terminate")
    page.locator("#session-status[data-status=TERMINATED]").wait_for()
    assert api.get(f"/v1/sessions/{session['id']}").json()["status"] == "TERMINATED"
    page.goto("/ui")
    page.locator("[data-count=TERMINATED]").wait_for()
    _shot(page, "overview")
    page.context.close()


def test_the_queue_shows_a_blocked_session_with_its_reason(browser: Any, api: httpx.Client) -> None:
    """A session that fits only when another ends waits on the queue page with the
    scheduler's reason."""
    cpu = api.get("/v1/agents").json()["items"][0]["capacity"]["cpu"]
    filler = _submit(api, name="filler", resources={"cpu": cpu})
    _wait_running(api, filler["id"])
    session = _submit(api, name="blocked", resources={"cpu": cpu})
    page = _signed_in(browser, api, _admin_token(api))
    page.goto("/ui/queue")
    row = page.locator(f"tr[data-session='{session['id']}']")
    reason = row.locator("code.reason").inner_text()
    explained = api.get(f"/v1/sessions/{session['id']}/explain").json()
    assert reason == (explained["code"] or explained["outcome"])
    assert explained["message"] in row.inner_text()
    _shot(page, "queue")
    page.goto("/ui/agents")
    _shot(page, "agents")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    page.goto("/ui")
    _shot(page, "overview-phone")
    page.context.close()
    for ended in (session, filler):
        api.post(f"/v1/sessions/{ended['id']}/terminate")


def test_a_plain_user_sees_only_their_own_and_actions_need_the_csrf_token(
    browser: Any, api: httpx.Client
) -> None:
    """Bob does not see the admin's session in his table nor by its URL; a POST without the
    page's CSRF token is refused, with it his own session is terminated."""
    theirs = _submit(api, name="admins-own")
    assert api.post("/v1/users", json={"name": "bob", "role": "user"}).status_code == 201
    issued = api.post("/v1/users/bob/tokens", json={"name": "browser"})
    assert issued.status_code == 201, issued.text
    page = _signed_in(browser, api, issued.json()["token"])
    assert "admins-own" not in page.content()
    page.goto(f"/ui/sessions/{theirs['id']}")
    assert page.locator("h1").inner_text() == "No such session"
    assert "admins-own" not in page.content()
    bob = httpx.Client(
        base_url=api.base_url, headers={"Authorization": f"Bearer {issued.json()['token']}"}
    )
    with bob:
        own = bob.post(
            "/v1/sessions", json={"image": "python", "command": ["python", "-c", LONG]}
        ).json()
    page.goto(f"/ui/sessions/{own['id']}")
    url = f"/ui/sessions/{own['id']}/terminate"
    without = page.evaluate(f"fetch('{url}', {{method: 'POST'}}).then(r => r.status)")
    assert without == 403
    token = page.locator(f"input[name={CSRF_FIELD}]").first.get_attribute("value")
    with_token = page.evaluate(
        f"fetch('{url}', {{method: 'POST', headers: {{'x-csrf-token': '{token}'}}}})"
        ".then(r => r.status)"
    )
    assert with_token == 200  # the redirect to the session's page, followed
    assert api.get(f"/v1/sessions/{own['id']}").json()["status"] in (
        "TERMINATING",
        "TERMINATED",
        "CANCELLED",
    )
    page.context.close()
    api.post(f"/v1/sessions/{theirs['id']}/terminate")


# A replica: answers every GET (its health check included) on the port corral gives it.
REPLICA = (
    "import os; from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "class H(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.send_header('Content-Length', '2'); self.end_headers()\n"
    "        self.wfile.write(b'ok')\n"
    "    def log_message(self, *args): pass\n"
    "HTTPServer(('0.0.0.0', int(os.environ['CORRAL_PORT'])), H).serve_forever()\n"
)


def test_the_deployments_page_shows_a_deployment_and_its_routes_live(
    browser: Any, api: httpx.Client
) -> None:
    """A deployment created through the API is listed; its page shows its route turning
    healthy without a reload, with its address and last probe."""
    created = api.post(
        "/v1/deployments",
        json={
            "name": "dash-web",
            "image": "python",
            "command": ["python", "-c", REPLICA],
            "resources": {"cpu": 0.1},
            "replicas": 1,
            "health_check": {"interval_s": 1},
        },
    )
    assert created.status_code == 201, created.text
    deployment = created.json()
    try:
        page = _signed_in(browser, api, _admin_token(api))
        page.goto("/ui/deployments")
        row = page.locator(f"tr[data-deployment='{deployment['id']}']")
        assert row.locator("td").first.inner_text() == "dash-web"
        row.locator("a").first.click()
        page.wait_for_url(f"**/ui/deployments/{deployment['id']}")
        page.wait_for_selector("#live-state[data-state=on]")
        page.evaluate("window.notReloaded = true")
        page.locator("tr[data-route] [data-status=healthy]").wait_for()
        assert page.evaluate("window.notReloaded") is True
        (route,) = [
            r
            for r in api.get(f"/v1/deployments/{deployment['id']}").json()["routes"]
            if r["status"] == "healthy"
        ]
        shown = page.locator(f"tr[data-route='{route['id']}']")
        assert shown.locator(".address").inner_text() == f"{route['host']}:{route['port']}"
        assert shown.locator(".probed").inner_text().endswith(" ago")
        assert shown.locator(".failures").inner_text().startswith("0")
        _shot(page, "deployment")
        page.goto("/ui/deployments")
        page.locator(f"tr[data-deployment='{deployment['id']}'] [data-healthy='1']").wait_for()
        _shot(page, "deployments")
        page.context.close()
    finally:
        api.delete(f"/v1/deployments/{deployment['id']}")


def _database(up: Up) -> Path:
    return Path(up.env["XDG_DATA_HOME"]) / "corral" / "corral.db"


def _write_session(up: Up, session_id: str, **values: object) -> None:
    """Set columns of a session in the manager's SQLite database, as admission would have."""
    columns = ", ".join(f"{name} = ?" for name in values)
    with sqlite3.connect(_database(up), timeout=30) as conn:
        conn.execute(
            f"UPDATE sessions SET {columns} WHERE id = ?",
            [*values.values(), uuid.UUID(session_id).hex],
        )


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")


def test_the_queue_shows_admission_state_and_activates_a_deactivated_session(
    browser: Any, api: httpx.Client, up: Up
) -> None:
    """With block_admission on, the queue names the admitted session it waits for; an
    evicted session shows its reason, requeue count and time; Activate on a deactivated one
    puts it back in the queue."""
    wait = {"enable": True, "block_admission": True, "timeout_s": 3600}
    changed = api.patch(
        "/v1/resource-groups/default", json={"options": {"wait_for_kernels_ready": wait}}
    )
    assert changed.status_code == 200, changed.text
    admitted = _submit(api, name="admitted")
    evicted: dict[str, Any] = {}
    parked: dict[str, Any] = {}
    try:
        _wait_running(api, admitted["id"])
        now = datetime.now(UTC)
        # Its kernel stopped being ready (as a lost kernel makes it): the group's admission
        # now waits for it, so what is submitted next stays in the queue.
        _write_session(
            up,
            admitted["id"],
            kernels_ready=False,
            kernels_ready_reason="WaitForRecovery",
            kernels_ready_at=_stamp(now),
        )
        evicted = _submit(api, name="evicted")
        parked = _submit(api, name="parked")
        back_at = now + timedelta(minutes=10)
        _write_session(
            up,
            evicted["id"],
            evicted_at=_stamp(now),
            eviction_reason="KernelsReadyTimeout",
            requeue_count=2,
            requeue_at=_stamp(back_at),
        )
        _write_session(
            up,
            parked["id"],
            evicted_at=_stamp(now),
            eviction_reason="KernelsReadyTimeout",
            requeue_count=3,
            requeue_active=False,
            deactivated_at=_stamp(now),
        )
        page = _signed_in(browser, api, _admin_token(api))
        page.goto("/ui/queue")
        blocker = page.locator(f"[data-blocker='{admitted['id']}']")
        assert f"session #{admitted['number']}" in blocker.inner_text()
        assert "WaitForRecovery" in blocker.inner_text()
        row = page.locator(f"tr[data-session='{evicted['id']}']")
        assert row.locator(".eviction-reason").inner_text() == "KernelsReadyTimeout"
        assert row.locator("[data-requeue-count]").inner_text() == "2"
        assert back_at.strftime("%Y-%m-%d %H:%M:%S") in row.locator(".requeue").inner_text()
        assert row.locator("code.reason").inner_text() == "requeue_at"
        deactivated = page.locator(f"tr[data-session='{parked['id']}']")
        assert deactivated.locator("[data-admission=deactivated]").is_visible()
        _shot(page, "queue-admission")
        deactivated.locator("button.activate").click()
        page.wait_for_url("**/ui/queue")
        page.locator(f"tr[data-session='{parked['id']}'] code.reason").wait_for()
        assert page.locator(f"tr[data-session='{parked['id']}'] button.activate").count() == 0
        after = api.get(f"/v1/sessions/{parked['id']}").json()
        assert after["active"] is True and after["requeue_count"] == 0
        assert after["status"] == "PENDING"  # still behind the admission block
        page.goto(f"/ui/sessions/{admitted['id']}")
        ready = page.locator("#kernels-ready")
        assert ready.get_attribute("data-reason") == "WaitForRecovery"
        page.context.close()
    finally:
        off = api.patch(
            "/v1/resource-groups/default",
            json={"options": {"wait_for_kernels_ready": {"enable": False}}},
        )
        assert off.status_code == 200, off.text
        for ended in (parked, evicted, admitted):
            if ended:
                api.post(f"/v1/sessions/{ended['id']}/terminate")
