"""Usage errors (a bad flag or value) as one `corral: error: ...` line, not typer's boxed panel.

typer raises click's exceptions from its own copy of click, all `typer.TyperException`s.
"""

from __future__ import annotations

import sys

import typer

from corral.domain.field_errors import plain_message


def is_help_shown(error: typer.TyperException) -> bool:
    """True for the error of a command group run without a command: its help is on screen."""
    # By name, as typer itself checks it: the class is not public.
    return type(error).__name__ == "NoArgsIsHelpError"


def usage_message(error: typer.TyperException) -> str:
    """What was wrong with the command line, in corral's words, with where to read more."""
    if isinstance(error, typer.BadParameter) and error.message:
        message = f"{_parameter(error)}: {_bad_value(error)}"
    else:
        message = _sentence(error.format_message())
    context = getattr(error, "ctx", None)
    if context is not None:
        message += f"; see `{context.command_path} --help`"
    return message


def _parameter(error: typer.BadParameter) -> str:
    hint = error.param_hint
    if hint is None and error.param is not None:
        hint = error.param.get_error_hint()
    if not isinstance(hint, str):
        hint = " / ".join(hint or ["value"])
    return hint.replace("'", "")


def _bad_value(error: typer.BadParameter) -> str:
    # typer checks types and `min=`/`max=` with pydantic: word its errors as the API does.
    # (Imported by then if the error is pydantic's: a valid command line never loads it.)
    cause = error.__cause__
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(cause, pydantic.ValidationError) and cause.errors():
        detail = cause.errors()[0]
        given = detail.get("input")
        got = f" (got {given})" if isinstance(given, str | int | float) else ""
        return plain_message(detail) + got
    return _sentence(error.message)


def _sentence(text: str) -> str:
    """`No such option: --x.` as part of our line: `no such option: --x`."""
    text = text.strip().rstrip(".")
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    return text
