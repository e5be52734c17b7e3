"""`corral db` as a user runs it: a subprocess, a real SQLite file, settings from the env."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e._cli import corral


def test_db_upgrade_creates_the_default_database_then_reports_current(tmp_path: Path) -> None:
    """With no URL given, `corral db upgrade` migrates corral.db in the data directory."""
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path),
        "CORRAL_CONFIG": str(tmp_path / "none.toml"),
    }
    env.pop("CORRAL_DATABASE_URL", None)
    before = corral("db", "status", "--json", env=env)
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["revision"] is None

    upgraded = corral("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr
    assert (tmp_path / "corral" / "corral.db").exists()

    after = json.loads(corral("db", "status", "--json", env=env).stdout)
    assert after["current"] is True and after["revision"] == after["head"]


def test_db_upgrade_honours_the_database_flag_over_the_environment(tmp_path: Path) -> None:
    """--database wins over CORRAL_DATABASE_URL."""
    target = tmp_path / "flag.db"
    env = {
        **os.environ,
        "CORRAL_DATABASE_URL": f"sqlite:///{tmp_path / 'env.db'}",
        "CORRAL_CONFIG": str(tmp_path / "none.toml"),
    }
    result = corral("db", "upgrade", "--database", f"sqlite:///{target}", env=env)
    assert result.returncode == 0, result.stderr
    assert target.exists() and not (tmp_path / "env.db").exists()


def test_a_bad_database_url_is_a_clear_error(tmp_path: Path) -> None:
    """An unsupported scheme fails with exit status 1 and a message naming the fix, no traceback."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral("db", "status", "--database", "mysql://root@localhost/x", env=env)
    assert result.returncode != 0
    assert "not supported" in result.stderr
    assert "Traceback" not in result.stderr
