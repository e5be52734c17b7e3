"""Commands imported only when they run: a user's `corral run` does not load the manager.

The daemons and harnesses (`manager`, `agent`, `up`, `simulate`, `bench`, `db`) pull in the
server stack — SQLAlchemy, FastAPI, uvicorn, OpenTelemetry, the store — about 2 s of CPU to
import. Every `corral` command paid it, the user verbs too; on a busy machine that made a
`corral run -- python -c 'print(1)'` take tens of seconds before it sent its request.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, ClassVar

import typer
from typer.core import TyperGroup

# A command as typer builds it (click's, which typer vendors from 0.2x on: typed loosely).
Loader = Callable[[], Any]


def command(name: str, module: str, function: str, **settings: Any) -> Loader:
    """Load `module.function` as the command `name` (with typer's `command()` settings)."""

    def load() -> Any:
        single = typer.Typer(add_completion=False)
        single.command(name, **settings)(getattr(importlib.import_module(module), function))
        return typer.main.get_command(single)

    return load


def group(name: str, module: str, extend: Callable[[typer.Typer], None] | None = None) -> Loader:
    """Load the typer app `module.app` as the group `name` (`extend` adds commands to it)."""

    def load() -> Any:
        app: typer.Typer = importlib.import_module(module).app
        if extend is not None:
            extend(app)
        loaded = typer.main.get_command(app)
        loaded.name = name
        return loaded

    return load


class LazyGroup(TyperGroup):
    """A typer group with commands loaded on first use (`loaders`, set by a subclass)."""

    loaders: ClassVar[dict[str, Loader]] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        eager = super().list_commands(ctx)
        return [*eager, *(name for name in self.loaders if name not in eager)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in self.loaders:
            found = self.commands[cmd_name] = self.loaders[cmd_name]()
        return found
