"""Settings precedence and the database URL default."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from corral.domain.slots import ResourceSlots
from corral.settings import load_settings


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Each test gets its own config file path and data home, and no CORRAL_* variables."""
    for name in ("CORRAL_DATABASE_URL", "CORRAL_DATA_DIR", "CORRAL_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CORRAL_CONFIG", str(tmp_path / "corral.toml"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


def test_default_database_is_a_sqlite_file_in_the_data_directory(isolated: Path) -> None:
    """With nothing configured, corral uses corral.db under $XDG_DATA_HOME/corral."""
    url = load_settings().resolved_database_url()
    assert url == f"sqlite:///{isolated / 'data' / 'corral' / 'corral.db'}"


def test_flags_beat_environment_beat_toml(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag overrides CORRAL_DATABASE_URL, which overrides corral.toml."""
    (isolated / "corral.toml").write_text('database_url = "sqlite:////from/toml.db"\n')
    assert load_settings().resolved_database_url() == "sqlite:////from/toml.db"
    monkeypatch.setenv("CORRAL_DATABASE_URL", "postgresql://env@db:5432/corral")
    assert load_settings().resolved_database_url() == "postgresql://env@db:5432/corral"
    flagged = load_settings(database_url="sqlite:////from/flag.db", redis_url=None)
    assert flagged.resolved_database_url() == "sqlite:////from/flag.db"


def test_an_unusable_database_url_names_the_field() -> None:
    """A URL with an unsupported scheme is rejected with a message naming the setting."""
    with pytest.raises(ValidationError) as info:
        load_settings(database_url="mysql://root@localhost/db")
    error = info.value.errors()[0]
    assert error["loc"] == ("database_url",)
    assert "not supported" in error["msg"]


def test_loop_intervals_default_and_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loop intervals default to 2 s / 60 s; a short one above the long one is refused."""
    settings = load_settings()
    assert (settings.short_interval_s, settings.long_interval_s) == (2.0, 60.0)
    monkeypatch.setenv("CORRAL_LONG_INTERVAL_S", "10")
    assert load_settings(short_interval_s=0.5).long_interval_s == 10.0
    with pytest.raises(ValueError, match="must not exceed"):
        load_settings(short_interval_s=30)
    with pytest.raises(ValueError, match="greater than 0"):
        load_settings(short_interval_s=0)


def test_request_limits_are_settings(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_kernel_slots reads slots as `corral run` writes them (environment or corral.toml);
    max_request_bytes defaults to 8 MiB and may not go below what a valid session takes."""
    settings = load_settings()
    assert (settings.max_kernel_slots, settings.max_request_bytes) == (None, 8 * 2**20)
    monkeypatch.setenv("CORRAL_MAX_KERNEL_SLOTS", "cpu=64,mem=512Gi")
    assert load_settings().max_kernel_slots == ResourceSlots({"cpu": 64, "mem": "512Gi"})
    monkeypatch.delenv("CORRAL_MAX_KERNEL_SLOTS")
    (isolated / "corral.toml").write_text('max_kernel_slots = {cpu = 8, "cuda.device" = 2}\n')
    assert load_settings().max_kernel_slots == ResourceSlots({"cpu": 8, "cuda.device": 2})
    with pytest.raises(ValidationError, match="max_kernel_slots"):
        load_settings(max_kernel_slots="cpu=lots")
    with pytest.raises(ValidationError, match="max_request_bytes"):
        load_settings(max_request_bytes=1024)
