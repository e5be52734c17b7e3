"""Where the SDK and the CLI find the server: `config.toml`, overridden by the environment.

The file is `$XDG_CONFIG_HOME/corral/config.toml` (else `~/.config/corral/config.toml`) with
`url`, `token` and optionally `ca_file` (the CA that signed an https manager's certificate, when
not one of the system's); `CORRAL_URL`, `CORRAL_TOKEN` and `CORRAL_CA_FILE` override each key.
`corral up` writes it.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from urllib.parse import urlsplit

from corral._private_file import write_private
from corral._tls import CA_FILE_VARIABLE
from corral.domain.record import record

URL_VARIABLE = "CORRAL_URL"
TOKEN_VARIABLE = "CORRAL_TOKEN"
_HOW_TO_CONFIGURE = f"run `corral up` or set {URL_VARIABLE} and {TOKEN_VARIABLE}"


class ClientConfigError(Exception):
    """The server's URL or token is missing or unusable; the message says how to fix it."""


@record
class ClientConfig:
    """The server to talk to, the bearer token to show it, and the CA to trust (None: the
    system's store)."""

    url: str
    token: str = field(repr=False)
    ca_file: str | None = None


def client_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CONFIG_HOME/corral/config.toml`, else `~/.config/corral/config.toml`."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "corral" / "config.toml"


def load_client_config(
    path: Path | None = None, environ: Mapping[str, str] | None = None
) -> ClientConfig:
    """The configured server: the file's `url`, `token` and `ca_file`, each overridden by its
    variable."""
    env = os.environ if environ is None else environ
    path = path or client_config_path(env)
    stored = _read(path)
    url = env.get(URL_VARIABLE) or stored.get("url") or ""
    token = env.get(TOKEN_VARIABLE) or stored.get("token") or ""
    if not url and not token:
        raise ClientConfigError(f"no corral server is configured: {_HOW_TO_CONFIGURE}")
    if not url:
        raise ClientConfigError(
            f"no server URL: set {URL_VARIABLE} (e.g. http://127.0.0.1:8470) or `url` in {path}"
        )
    if not token:
        raise ClientConfigError(f"no token for {url}: set {TOKEN_VARIABLE} or `token` in {path}")
    ca_file = env.get(CA_FILE_VARIABLE) or stored.get("ca_file") or None
    return ClientConfig(check_url(url), token, ca_file)


def check_url(url: str) -> str:
    """`url` without a trailing slash, when it is an http(s) URL; else ClientConfigError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ClientConfigError(
            f"server URL {url!r} must start with http:// or https://, like http://127.0.0.1:8470"
        )
    return url.rstrip("/")


def write_client_config(url: str, token: str, path: Path | None = None) -> Path:
    """Save `url` and `token` for later commands, readable by this user only; the file's path."""
    path = path or client_config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # A JSON string is a valid TOML basic string (same quotes and escapes), so no TOML writer.
    text = f"url = {json.dumps(check_url(url))}\ntoken = {json.dumps(token)}\n"
    write_private(path, text)
    return path


def _read(path: Path) -> dict[str, str]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ClientConfigError(f"cannot read {path}: {exc}; fix or remove the file") from exc
    for key in ("url", "token", "ca_file"):
        if key in data and not isinstance(data[key], str):
            raise ClientConfigError(f"{path}: `{key}` must be a string")
    return {key: value for key, value in data.items() if isinstance(value, str)}
