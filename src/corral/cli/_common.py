"""Helpers shared by the CLI commands: settings from flags, and errors a user can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from corral.settings import Settings


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `corral: error: <message>` to stderr and exit with `code`."""
    typer.echo(f"corral: error: {message}", err=True)
    raise typer.Exit(code)


def fail_unreachable(exc: BaseException) -> NoReturn:
    """Exit 1 saying a server the command needs did not answer."""
    reason = str(exc).rstrip(".")
    fail(f"cannot reach the server: {reason}; is it running, and is the URL right?", code=1)


def settings_from_flags(**flags: Any) -> Settings:
    """Load settings with the given flags on top; a bad value exits with a message naming it."""
    # Here, not at the top: the settings import the store (database URLs), which the user
    # verbs that share this module never need.
    from pydantic import ValidationError

    from corral.settings import load_settings

    try:
        return load_settings(**flags)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        fail(f"invalid setting — {problems}")


def without_credentials(url: str) -> str:
    """`url` from its host on (what follows the last `@`), for progress lines: no password."""
    return url.split("@")[-1]
