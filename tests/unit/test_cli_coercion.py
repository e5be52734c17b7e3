"""The flags' plain values converted without pydantic: exactly as typer converts them."""

from __future__ import annotations

import subprocess
import sys
from typing import Annotated, Any

import pytest
import typer
from hypothesis import example, given
from hypothesis import strategies as st
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import TypeDescriptor, build_runtime_param, resolve_type_descriptor
from typer.core import TyperCommand
from typer.models import OptionInfo
from typer.testing import CliRunner

from corral.cli import _coercion


def descriptor(annotation: Any, **option: Any) -> TypeDescriptor:
    return resolve_type_descriptor(annotation, OptionInfo(**option))


DESCRIPTORS = {
    "str": descriptor(str),
    "int": descriptor(int),
    "int 0..": descriptor(int, min=0),
    "int 1..": descriptor(int, min=1),
    "int 0..100": descriptor(int, min=0, max=100),
    "int -100..100": descriptor(int, min=-100, max=100),
    "list[str]": descriptor(list[str]),
}

# What a flag's value can be: command-line text (numbers among it), a default, a repeat.
VALUES = st.one_of(
    st.text(),
    st.from_regex(r"[ +\-]?[0-9_]{0,5}(\.[0-9])?[ ]?", fullmatch=True),
    st.integers(-1000, 1000),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
)


CONTEXT = Context(TyperCommand("probe"))


def typers(desc: TypeDescriptor, value: Any) -> tuple[str, Any]:
    """What typer's own conversion makes of `value`: ("ok", result) or ("error", message)."""
    try:
        return "ok", build_runtime_param(desc)._coerce_value(value, param=None, ctx=CONTEXT)  # type: ignore[arg-type]
    except (BadParameter, ValueError, TypeError) as exc:
        return "error", str(exc)


@pytest.mark.parametrize("kind", sorted(DESCRIPTORS))
@given(value=VALUES)
@example(value="007")
@example(value="-0")
@example(value="1_000")
@example(value="+5")
@example(value=" 5")
@example(value="٣")
@example(value="-1")
@example(value="101")
def test_a_plain_value_converts_as_typer_converts_it(kind: str, value: Any) -> None:
    """Every value `plain_value` converts, typer converts to the same value of the same type;
    the rest it leaves to typer."""
    desc = DESCRIPTORS[kind]
    plain = _coercion.plain_value(desc, value)
    if plain is _coercion._NOT_PLAIN:
        return
    outcome, result = typers(desc, value)
    assert outcome == "ok", (value, result)
    assert (type(plain), plain) == (type(result), result)


def test_a_value_out_of_range_or_unusual_gets_typers_own_conversion() -> None:
    """Out of a flag's range, or written as typer alone reads it, a value is typer's to judge."""
    not_plain = [
        (DESCRIPTORS["int 0.."], "-1"),
        (DESCRIPTORS["int 0..100"], 101),
        (DESCRIPTORS["int"], "+5"),
        (DESCRIPTORS["int"], "1_000"),
        (DESCRIPTORS["int"], True),
        (DESCRIPTORS["str"], 5),
        (DESCRIPTORS["list[str]"], ("a", 1)),
        (descriptor(float), "1.5"),
        (descriptor(int, clamp=True, max=3), "9"),
    ]
    for desc, value in not_plain:
        assert _coercion.plain_value(desc, value) is _coercion._NOT_PLAIN, value


def test_the_command_line_converts_through_direct_params() -> None:
    """`corral.cli` installs the conversion: a command's flags go through it, and a bad value
    is still typer's error, in corral's words."""
    from corral.cli import main  # noqa: F401  (installs it)

    assert _coercion.installed()
    seen: dict[str, Any] = {}
    app = typer.Typer()

    @app.command()
    def command(
        count: Annotated[int, typer.Option(min=0)] = 0,
        names: Annotated[list[str] | None, typer.Option()] = None,
    ) -> None:
        seen.update(count=count, names=names)

    click_command = typer.main.get_command(app)
    click_command.main(["--count", "7", "--names", "a", "--names", "b"], standalone_mode=False)
    assert seen == {"count": 7, "names": ["a", "b"]}
    runtime = {p.name: p._runtime_param for p in click_command.params}  # type: ignore[attr-defined]
    assert all(isinstance(r, _coercion.DirectParam) for r in runtime.values()), runtime
    refused = CliRunner().invoke(app, ["--count", "-3"])
    assert refused.exit_code == 2
    assert "greater than or equal to 0" in refused.output


def test_a_valid_command_line_does_not_import_pydantic() -> None:
    """Parsing `corral run`'s usual flags loads no pydantic (typer's adapters are its import)."""
    probe = (
        "import sys; from corral.cli import app; from typer.main import get_command; "
        "from typer._click import Context; "
        "group = get_command(app); run = group.get_command(Context(group), 'run'); "
        "run.make_context('run', ['--cpu', '2', '--gpus', '1', '--priority', '-5', "
        "'-e', 'A=1', '--name', 'x', '--', 'true']); "
        "print('pydantic' in sys.modules)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "False", loaded.stderr
