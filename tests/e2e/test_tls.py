"""A cluster over TLS: `corral manager --tls-cert --tls-key`, an agent and the CLI that trust the
cluster's CA (`--ca-file`, `CORRAL_CA_FILE`), and a client that does not, refused. The CA is made
in the test (trustme); everything else is the real commands as processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from corral._tls import CA_FILE_VARIABLE
from tests.e2e._cli import corral

pytestmark = pytest.mark.timeout(180)

JOIN_TOKEN = "tls-join-token"
_BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **_BASE_ENV,
        "CORRAL_CONFIG": str(tmp_path / "none.toml"),
        "CORRAL_DATA_DIR": str(tmp_path / "data"),
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / ".config"),
        **extra,
    }


def _pki(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 it signed: (CA file, certificate chain, key)."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, chain, key = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    ca.cert_pem.write_to_path(str(ca_file))
    issued.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    return ca_file, chain, key


def _start(args: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen[str]:
    """`corral ARGS` as a process: its stderr a pipe, or with stdout into `log`."""
    command = [sys.executable, "-m", "corral", *args]
    if log is None:
        return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    finally:
        if process.stderr is not None:
            process.stderr.close()


def test_a_cluster_over_tls_trusts_its_ca_and_refuses_without_it(tmp_path: Path) -> None:
    ca_file, chain, key = _pki(tmp_path)
    database = f"sqlite:///{tmp_path / 'corral.db'}"
    env = _env(tmp_path)
    admin = corral("admin", "bootstrap", "--database", database, env=env)
    assert admin.returncode == 0, admin.stderr
    token = admin.stdout.strip()
    manager = _start(
        [
            "manager", "--database", database, "--port", "0", "--join-token", JOIN_TOKEN,
            "--tls-cert", str(chain), "--tls-key", str(key), "--log-level", "WARNING",
        ],
        env,
    )  # fmt: skip
    agent: subprocess.Popen[str] | None = None
    try:
        assert manager.stderr is not None
        url = next(
            (line.rsplit(" ", 1)[-1].strip() for line in manager.stderr if "listening on" in line),
            None,
        )
        assert url is not None, f"the manager exited with {manager.wait()} before listening"
        assert url.startswith("https://127.0.0.1:"), url
        agent = _start(
            [
                "agent", "--manager", url, "--token", JOIN_TOKEN, "--ca-file", str(ca_file),
                "--id", "tls-agent", "--slots", "cpu=2,mem=2g",
                "--data-dir", str(tmp_path / "agent"), "--stop-grace", "2",
            ],
            env,
            log=tmp_path / "agent.log",
        )  # fmt: skip
        trusting = {**env, "CORRAL_URL": url, "CORRAL_TOKEN": token, CA_FILE_VARIABLE: str(ca_file)}

        # The agent registers over TLS and runs the session the CLI submits, all verified.
        ran = corral(
            "run", "--", "python", "-c", "print('over tls')", env=trusting,
            timeout_s=120,
        )  # fmt: skip
        assert ran.returncode == 0, (ran.stdout, ran.stderr, _log(tmp_path))
        assert "over tls" in ran.stdout
        listed = corral("session", "ls", "--all-states", "--json", env=trusting)
        assert listed.returncode == 0, listed.stderr
        (session,) = json.loads(listed.stdout)
        assert session["status"] == "TERMINATED", session
        agents = corral("agent", "ls", "--json", env=trusting)
        assert [a["id"] for a in json.loads(agents.stdout)] == ["tls-agent"], agents.stderr

        # Without the CA, the manager's certificate is not trusted: a clear error, nothing sent.
        refused = corral("session", "ls", env={**trusting, CA_FILE_VARIABLE: ""})
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert refused.stderr.startswith(f"corral: error: the TLS certificate of {url} is not "), (
            refused.stderr
        )
        assert "certificate verify failed" in refused.stderr
        assert CA_FILE_VARIABLE in refused.stderr

        # A CA file that is no CA is named as such.
        bad = corral("session", "ls", env={**trusting, CA_FILE_VARIABLE: str(tmp_path / "none")})
        assert bad.returncode == 2, bad.stderr
        assert f"cannot use CA file {str(tmp_path / 'none')!r}" in bad.stderr
    finally:
        if agent is not None:
            _stop(agent)
        _stop(manager)


def _log(tmp_path: Path) -> str:
    return (tmp_path / "agent.log").read_text(errors="replace")
