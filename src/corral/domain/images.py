"""Which image a command runs in when the user names none (`corral run`, job files)."""

from __future__ import annotations

import re
from collections.abc import Sequence

# A lone argument with these is a shell script, not a program name.
_SHELL_SYNTAX = re.compile(r"[\s|&;<>()$`*?]")


def default_image(command: Sequence[str]) -> str:
    """`shell` for one argument that is a shell script, else `python` (which runs any argv)."""
    if len(command) == 1 and _SHELL_SYNTAX.search(command[0]):
        return "shell"
    return "python"
