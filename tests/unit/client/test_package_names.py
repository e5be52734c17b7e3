"""`corral.client` imports its names on first use: every one resolves, from where it is declared."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys

import corral.client


def _declared() -> dict[str, str]:
    """The names the package's `if TYPE_CHECKING:` block imports, each with its module."""
    tree = ast.parse(inspect.getsource(corral.client))
    [block] = [node for node in tree.body if isinstance(node, ast.If)]
    return {
        alias.name: statement.module
        for statement in block.body
        if isinstance(statement, ast.ImportFrom) and statement.module
        for alias in statement.names
    }


def test_every_exported_name_resolves_to_its_declared_home() -> None:
    """What type checkers see is what the package hands out, object for object."""
    declared = _declared()
    assert declared == corral.client._HOMES
    assert corral.client.__all__ == sorted(declared)
    for name, module in declared.items():
        assert getattr(corral.client, name) is getattr(importlib.import_module(module), name)


def test_importing_the_package_builds_no_model() -> None:
    """`import corral.client` and its configuration load neither pydantic nor httpx's client."""
    probe = (
        "import sys, corral.client; from corral.client import ClientConfigError; "
        "print(sorted(m for m in ('pydantic', 'corral.client.models', 'corral.client._client') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]"
