"""Helpers shared by the CLI commands: settings from flags, and errors a user can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer

from corral.domain.field_errors import describe, field_errors

if TYPE_CHECKING:
    from corral.settings import Settings

# Exit codes of every command: a usage error (a bad flag or value), any other failure.
USAGE_EXIT = 2
FAILURE_EXIT = 1
INTERRUPTED_EXIT = 130  # Ctrl-C: the shell's convention, 128 + SIGINT
# Set (to anything but 0) to see the traceback of an error the CLI did not expect.
DEBUG_VARIABLE = "CORRAL_DEBUG"


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    """Print `corral: error: <message>` to stderr and exit with `code`."""
    typer.echo(f"corral: error: {message}", err=True)
    raise typer.Exit(code)


def fail_unreachable(exc: BaseException) -> NoReturn:
    """Exit 1 saying a server the command needs did not answer."""
    reason = str(exc).rstrip(".")
    fail(
        f"cannot reach the server: {reason}; is it running, and is the URL right?",
        code=FAILURE_EXIT,
    )


def settings_from_flags(**flags: Any) -> Settings:
    """Load settings with the given flags on top; a bad value exits with a message naming it."""
    # Here, not at the top: the settings import the store (database URLs), which the user
    # verbs that share this module never need.
    from pydantic import ValidationError

    from corral.settings import load_settings

    try:
        return load_settings(**flags)
    except ValidationError as exc:
        fail(f"invalid setting — {describe(field_errors(exc))}")


def without_credentials(url: str) -> str:
    """`url` from its host on (what follows the last `@`), for progress lines: no password."""
    return url.split("@")[-1]


def env_flags(items: list[str]) -> dict[str, str]:
    """Repeated `--env KEY=VALUE` flags as a mapping (a malformed one fails the command)."""
    variables: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--env {item!r}: expected KEY=VALUE")
        variables[key] = value
    return variables
