"""Client configuration: the file, the environment over it, and a file only its user reads."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from corral.client import (
    Client,
    ClientConfig,
    ClientConfigError,
    client_config_path,
    load_client_config,
    write_client_config,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_lives_under_xdg_config_home(tmp_path: Path) -> None:
    """An absolute XDG_CONFIG_HOME is used; a relative one is ignored, as the spec says."""
    assert client_config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == (
        tmp_path / "corral" / "config.toml"
    )
    default = Path.home() / ".config" / "corral" / "config.toml"
    assert client_config_path({"XDG_CONFIG_HOME": "relative"}) == default
    assert client_config_path({}) == default


def test_written_config_is_read_back_and_readable_by_its_user_only(tmp_path: Path) -> None:
    """The file is 0600 in a 0700 directory, and loads as written."""
    path = tmp_path / "new" / "corral" / "config.toml"
    write_client_config("http://10.0.0.1:8470/", 'to"ken\\', path)
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700
    assert load_client_config(path, environ={}) == ClientConfig("http://10.0.0.1:8470", 'to"ken\\')


def test_rewriting_a_readable_file_makes_it_private(tmp_path: Path) -> None:
    """An existing world-readable file is replaced by a 0600 one."""
    path = tmp_path / "config.toml"
    path.write_text('url = "http://old"\n')
    path.chmod(0o644)
    write_client_config("http://new:1", "t", path)
    assert _mode(path) == 0o600
    assert load_client_config(path, environ={}).url == "http://new:1"
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]


def test_environment_overrides_each_key_of_the_file(tmp_path: Path) -> None:
    """CORRAL_URL and CORRAL_TOKEN win over the file, key by key."""
    path = tmp_path / "config.toml"
    write_client_config("http://file:1", "file-token", path)
    assert load_client_config(path, {"CORRAL_TOKEN": "env-token"}) == ClientConfig(
        "http://file:1", "env-token"
    )
    assert load_client_config(path, {"CORRAL_URL": "https://env:2"}) == ClientConfig(
        "https://env:2", "file-token"
    )


def test_environment_alone_is_enough(tmp_path: Path) -> None:
    """Without a file, the two variables configure the client."""
    config = load_client_config(
        tmp_path / "missing.toml", {"CORRAL_URL": "http://h:1", "CORRAL_TOKEN": "t"}
    )
    assert config == ClientConfig("http://h:1", "t")


def test_nothing_configured_says_how_to_configure(tmp_path: Path) -> None:
    """No file and no variables: the error names `corral up` and both variables."""
    with pytest.raises(ClientConfigError) as raised:
        load_client_config(tmp_path / "missing.toml", {})
    assert "run `corral up` or set CORRAL_URL and CORRAL_TOKEN" in str(raised.value)


def test_a_missing_half_is_named(tmp_path: Path) -> None:
    """A URL without a token (or the reverse) says which one is missing."""
    missing = tmp_path / "missing.toml"
    with pytest.raises(ClientConfigError, match="no token for http://h:1"):
        load_client_config(missing, {"CORRAL_URL": "http://h:1"})
    with pytest.raises(ClientConfigError, match="no server URL: set CORRAL_URL"):
        load_client_config(missing, {"CORRAL_TOKEN": "t"})


def test_a_broken_file_is_named(tmp_path: Path) -> None:
    """Invalid TOML, or a key of the wrong type, raises an error naming the file."""
    path = tmp_path / "config.toml"
    path.write_text("url = [")
    with pytest.raises(ClientConfigError, match=f"cannot read {path}"):
        load_client_config(path, {})
    path.write_text("url = 1\n")
    with pytest.raises(ClientConfigError, match="`url` must be a string"):
        load_client_config(path, {})


def test_a_url_without_scheme_is_refused(tmp_path: Path) -> None:
    """`host:port` alone is refused with an example of a good URL."""
    with pytest.raises(ClientConfigError, match=re.escape("like http://127.0.0.1:8470")):
        load_client_config(tmp_path / "x.toml", {"CORRAL_URL": "h:1", "CORRAL_TOKEN": "t"})


async def test_from_config_builds_a_client_of_the_configured_server() -> None:
    """`Client.from_config` uses the given configuration's URL; the token stays out of reprs."""
    config = ClientConfig("http://h:1/", "very-secret")
    assert "very-secret" not in repr(config)
    async with Client.from_config(config) as client:
        assert client.url == "http://h:1"


def test_the_ca_file_comes_from_the_file_and_the_environment_wins(tmp_path: Path) -> None:
    """`ca_file` in the file, overridden by CORRAL_CA_FILE; neither: None (the system's store)."""
    path = tmp_path / "config.toml"
    path.write_text('url = "https://m:8470"\ntoken = "t"\nca_file = "/etc/corral/ca.pem"\n')
    assert load_client_config(path, environ={}).ca_file == "/etc/corral/ca.pem"
    env = {"CORRAL_CA_FILE": "/other/ca.pem"}
    assert load_client_config(path, environ=env).ca_file == "/other/ca.pem"
    path.write_text('url = "https://m:8470"\ntoken = "t"\n')
    assert load_client_config(path, environ={}).ca_file is None


def test_a_ca_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ClientConfigError, match=re.escape(f"cannot use CA file {str(missing)!r}")):
        Client("https://m:8470", "t", ca_file=missing)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ClientConfigError, match=re.escape(f"cannot use CA file {str(garbage)!r}")):
        Client("https://m:8470", "t", ca_file=garbage)
