"""As an admin runs a cluster, with no curl: the first admin made on the database, then users,
tokens, resource groups and their access, and agents, all through `corral` commands against a
real manager; and plain users told no."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from corral.scheduler.validators import ACCESS_DENIED, NO_AGENTS
from tests.e2e._cli import corral
from tests.e2e._cluster import LiveCluster, live_cluster, poll
from tests.e2e._up import start_up

pytestmark = pytest.mark.timeout(300)

_BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}


def _env(tmp_path: Path, url: str | None = None, token: str | None = None) -> dict[str, str]:
    env = {**_BASE_ENV, "CORRAL_CONFIG": str(tmp_path / "none.toml"), "HOME": str(tmp_path)}
    env["XDG_CONFIG_HOME"] = str(tmp_path / ".config")
    if url is not None and token is not None:
        env.update(CORRAL_URL=url, CORRAL_TOKEN=token)
    return env


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` in a thread: the manager serves from this process's event loop."""
    return await asyncio.to_thread(corral, *args, env=env)


async def _ok(env: dict[str, str], *args: str) -> str:
    done = await _run(env, *args)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


async def _json(env: dict[str, str], *args: str) -> Any:
    return json.loads(await _ok(env, *args, "--json"))


async def _refused(env: dict[str, str], *args: str, code: int = 1) -> str:
    done = await _run(env, *args)
    assert done.returncode == code, (args, done.stdout, done.stderr)
    assert done.stderr.startswith("corral: error: "), done.stderr
    return done.stderr


async def _bootstrapped_admin(cluster: LiveCluster, database_url: str, tmp_path: Path) -> str:
    """`corral admin bootstrap` on the cluster's database; the admin's token."""
    env = _env(tmp_path)
    token = (await _ok(env, "admin", "bootstrap", "--database", database_url)).strip()
    assert token.startswith("crl_")
    return token


async def test_the_first_admin_is_made_on_the_database_once(
    database_url: str, tmp_path: Path
) -> None:
    """Bootstrap prints a token that works against the manager; a second one is refused with
    the admins named; --force mints another."""
    async with live_cluster(database_url, tmp_path) as cluster:
        env = _env(tmp_path)
        done = await _run(env, "admin", "bootstrap", "--database", database_url)
        assert done.returncode == 0, done.stderr
        token = done.stdout.strip()
        assert "admin admin created" in done.stderr and "shown only now" in done.stderr
        me = await _json(_env(tmp_path, cluster.manager.url, token), "user", "ls")
        assert {u["name"]: u["role"] for u in me}["admin"] == "admin"

        again = await _refused(env, "admin", "bootstrap", "--database", database_url)
        assert "the cluster has an admin already (admin)" in again
        assert "--force" in again
        forced = await _json(
            env, "admin", "bootstrap", "--database", database_url, "--force", "--expires-in", "1d"
        )
        assert (forced["user"], forced["created"]) == ("admin", False)
        assert forced["token"] != token and forced["expires_at"] is not None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_an_admin_manages_users_and_tokens_and_users_their_own(
    database_url: str, tmp_path: Path
) -> None:
    """Users made with a token each; a user lists, makes and revokes their own tokens but not
    another's; an admin's commands refused to a plain user say so; a removed user's token
    stops working."""
    async with live_cluster(database_url, tmp_path) as cluster:
        url = cluster.manager.url
        admin = _env(tmp_path, url, await _bootstrapped_admin(cluster, database_url, tmp_path))
        alice_token = (await _ok(admin, "user", "create", "alice", "--token")).strip()
        bob_token = (await _ok(admin, "user", "create", "bob", "--token")).strip()
        alice, bob = _env(tmp_path, url, alice_token), _env(tmp_path, url, bob_token)
        users = {u["name"]: u["role"] for u in await _json(admin, "user", "ls")}
        assert (users["alice"], users["bob"], users["admin"]) == ("user", "user", "admin")

        (initial,) = await _json(alice, "token", "ls")
        assert initial["name"] == "initial" and initial["expires_at"] is not None
        laptop = await _json(alice, "token", "create", "laptop", "--expires-in", "1d")
        assert laptop["user"] == "alice"
        assert (await _ok(_env(tmp_path, url, laptop["token"]), "session", "ls")) == ""
        assert "revoked" in await _ok(alice, "token", "revoke", "laptop")
        assert [t["name"] for t in await _json(alice, "token", "ls")] == ["initial"]
        gone = await _refused(_env(tmp_path, url, laptop["token"]), "session", "ls")
        assert "the token is unknown" in gone

        for args in (("token", "ls", "--user", "bob"), ("user", "ls"), ("user", "rm", "bob")):
            said = await _refused(alice, *args)
            assert "alice" in said and ("only admins" in said or "own tokens" in said), said
        assert len(await _json(admin, "token", "ls", "--user", "bob")) == 1

        assert "now an admin" in await _ok(admin, "user", "set", "bob", "--role", "admin")
        assert "now a user" in await _ok(bob, "user", "set", "bob", "--role", "user")
        assert "removed" in await _ok(admin, "user", "rm", "bob")
        assert "the token is unknown" in await _refused(bob, "session", "ls")
        last = await _refused(admin, "user", "rm", "admin")
        assert "'admin' is the only admin" in last


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_resource_group_access_through_the_cli(database_url: str, tmp_path: Path) -> None:
    """An admin opens a group to one user: others are refused at submission, a priority above
    the group's maximum too; a queued session whose owner is taken off waits, and
    `session ls` says why; opening the group again lets it go on."""
    async with live_cluster(database_url, tmp_path) as cluster:
        url = cluster.manager.url
        admin = _env(tmp_path, url, await _bootstrapped_admin(cluster, database_url, tmp_path))
        alice = _env(
            tmp_path, url, (await _ok(admin, "user", "create", "alice", "--token")).strip()
        )
        bob = _env(tmp_path, url, (await _ok(admin, "user", "create", "bob", "--token")).strip())

        made = await _json(
            admin, "group", "create", "gpu", "--users", "alice", "--max-user-priority", "5",
            "--set", "ordering=best_effort", "--description", "the A100s",
            "--set", "phase_limits.StartSessions.timeout_s=600",
        )  # fmt: skip
        assert made["options"]["allowed_users"] == ["alice"]
        assert (made["options"]["max_user_priority"], made["options"]["ordering"]) == (
            5,
            "best_effort",
        )
        assert made["options"]["phase_limits"]["StartSessions"]["timeout_s"] == 600
        listed = {g["name"]: g for g in await _json(bob, "group", "ls")}
        assert set(listed) == {"default", "gpu"}
        assert "admins, alice" in await _ok(bob, "group", "ls")
        assert "only admins may do this" in await _refused(bob, "group", "set", "gpu", "--open")

        run = ("run", "--detach", "--resource-group", "gpu", "--", "true")
        said = await _refused(bob, *run)
        assert "resource_group: resource group 'gpu' is open to listed users only" in said
        said = await _refused(alice, "run", "--priority", "6", *run[1:])
        assert "priority: priority 6 is above 5, the max_user_priority" in said
        job = tmp_path / "job.yaml"
        job.write_text('resource_group: gpu\ncommand: ["true"]\narray: 0-3\n')
        said = await _refused(bob, "submit", str(job))
        assert "resource group 'gpu' is open to listed users only, and 'bob'" in said
        number = (await _ok(alice, *run)).strip()

        async def reason() -> str | None:
            (session,) = await _json(alice, "session", "ls")
            assert str(session["number"]) == number
            found: str | None = session["reason"]
            return found

        assert await reason() == NO_AGENTS  # the group has no agent yet
        removed = await _json(admin, "group", "set", "gpu", "--remove-user", "alice")
        assert removed["options"]["allowed_users"] == []
        assert await reason() == ACCESS_DENIED
        assert ACCESS_DENIED in await _ok(alice, "session", "ls")
        await _json(admin, "group", "set", "gpu", "--open", "--unset", "ordering")
        assert await reason() == NO_AGENTS
        shown = await _json(admin, "group", "show", "gpu")
        assert (shown["options"]["allowed_users"], shown["options"]["ordering"]) == (None, "strict")
        bad = await _refused(admin, "group", "set", "gpu", "--set", "sequencer=fastest", code=2)
        assert "options.sequencer" in bad


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_an_admin_drains_undrains_and_removes_an_agent(
    database_url: str, tmp_path: Path
) -> None:
    """drain and undrain show in `agent ls`; a live agent is not removed; once it left it is;
    a plain user may do none of it."""
    async with live_cluster(database_url, tmp_path) as cluster:
        url = cluster.manager.url
        admin = _env(tmp_path, url, await _bootstrapped_admin(cluster, database_url, tmp_path))
        bob = _env(tmp_path, url, (await _ok(admin, "user", "create", "bob", "--token")).strip())
        cluster.start_agent("node-x", "cpu=1,mem=1g", "--runtime", "simulated")
        await cluster.wait_agents_alive({"node-x"})

        assert (await _json(admin, "agent", "drain", "node-x"))["schedulable"] is False
        (agent,) = await _json(bob, "agent", "ls")
        assert (agent["id"], agent["schedulable"]) == ("node-x", False)
        assert "only admins may do this" in await _refused(bob, "agent", "undrain", "node-x")
        assert "takes work again" in await _ok(admin, "agent", "undrain", "node-x")
        assert "is ALIVE" in await _refused(admin, "agent", "rm", "node-x")

        process = cluster.agents["node-x"]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0

        async def left() -> bool:
            # LOST once its heartbeat timeout passed (TERMINATED, had it deregistered).
            return (await _json(admin, "agent", "ls"))[0]["status"] in ("TERMINATED", "LOST")

        await poll(left, what="node-x to leave")
        assert "only admins may do this" in await _refused(bob, "agent", "rm", "node-x")
        assert "removed" in await _ok(admin, "agent", "rm", "node-x")
        assert await _json(admin, "agent", "ls") == []
        assert "not registered" in await _refused(admin, "agent", "rm", "node-x")


def test_corral_up_keeps_its_admin_token_across_restarts(tmp_path: Path) -> None:
    """The second `corral up` on the same data directory uses the token the first one made,
    kept in a file only its owner reads."""
    config = tmp_path / "home" / ".config" / "corral" / "config.toml"
    tokens = []
    for _ in range(2):
        for up in start_up(tmp_path):
            tokens.append(tomllib.loads(config.read_text())["token"])
            assert up.corral("session", "ls").returncode == 0
    kept = tmp_path / "home" / ".local" / "share" / "corral" / "admin-token"
    assert kept.stat().st_mode & 0o777 == 0o600
    assert tokens[0] == tokens[1] == kept.read_text().strip()
