"""The commands' quickest way to a manager: plain synchronous requests (`client._http.PlainCall`).

`corral run --detach` and `corral session ls` send a request or three and print what the API
answers: they load neither the SDK's async client nor its models nor asyncio, and start in
a fraction of the time. Their errors end as every command's do (`failed`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

from corral.cli._common import FAILURE_EXIT, INTERRUPTED_EXIT, USAGE_EXIT, fail
from corral.client.config import ClientConfigError
from corral.client.errors import CorralError, ValidationError
from corral.domain.refs import REF_AMBIGUOUS, REF_NAMES_ARRAY

if TYPE_CHECKING:
    from corral.client._http import PlainCall

T = TypeVar("T")

# Problems that say the reference itself must be retyped: usage errors (exit 2).
_REF_PROBLEMS = frozenset({REF_AMBIGUOUS, REF_NAMES_ARRAY})


def plain_call() -> PlainCall:
    """The plain client of the configured server (tests replace it to inject a transport)."""
    from corral.client._http import PlainCall
    from corral.client.config import load_client_config

    config = load_client_config()
    return PlainCall(config.url, config.token, ca_file=config.ca_file)


def plain(work: Callable[[PlainCall], T]) -> T:
    """Run `work` with a plain client; errors exit as `_remote.call`'s do (`failed`)."""
    try:
        return work(plain_call())
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED_EXIT) from None
    except (ClientConfigError, CorralError) as exc:
        failed(exc)


def failed(exc: ClientConfigError | CorralError) -> NoReturn:
    """Exit for a failed call: 2 when the input must change (a value the server refused, no
    configured server, a session reference that fits several sessions or names a whole job
    array), else 1 (what the API or the network said)."""
    if isinstance(exc, ClientConfigError | ValidationError):
        fail(str(exc), code=USAGE_EXIT)
    fail(str(exc), code=USAGE_EXIT if exc.kind in _REF_PROBLEMS else FAILURE_EXIT)


def unexpected(call: PlainCall, what: str, exc: Exception) -> CorralError:
    """The error for an answer without what corral reads from it (not a corral manager?)."""
    return CorralError(
        f"{what} answered without what corral expects ({type(exc).__name__}: {exc}); "
        f"is {call.url} a corral manager?"
    )
