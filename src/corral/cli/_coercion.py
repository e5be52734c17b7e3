"""Flag values converted without pydantic where they are plain: a command starts ~40 ms sooner.

typer 0.29 converts each parameter's value with a pydantic `TypeAdapter`, built on first use
for every parameter of the command run (24 for `corral run`, whether given or not): pydantic's
import and those builds were a third of `corral run --detach`'s wall time. Installed by
`corral.cli`, `DirectParam` takes typer's place for each parameter: it converts the values
whose conversion is plain itself (a string as a string, `-?[0-9]+` within the flag's `min` and
`max` as an int, a repeated string flag as a list) and hands every other value to the adapter
typer would have used, built then. The result is typer's for every value: what it converts is
what typer returns (a test compares both on generated input), and a bad value, or one of
another type (an enum, a path, a number written `+1` or `1_000`), gets typer's own conversion
and its own error, word for word.

This reaches into typer's internals (`_TyperParameter.get_runtime_param`, `RuntimeParam`,
`build_runtime_param`), so `pyproject.toml` keeps typer below 0.30 and a test checks that the
hook is in place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from typer import core as typer_core
from typer._click import Context
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._typing import get_args, get_origin

_INTEGER = re.compile(r"-?[0-9]+")
_NOT_PLAIN = object()


@dataclass(frozen=True)
class DirectParam(RuntimeParam):
    """typer's conversion of one parameter, without pydantic for the values that are plain."""

    descriptor: TypeDescriptor
    # typer's own conversion, built the first time a value is not plain.
    _typers: list[RuntimeParam] = field(default_factory=list)

    @classmethod
    def of(cls, descriptor: TypeDescriptor) -> DirectParam:
        return cls(descriptor.parameter_info, descriptor.annotation, descriptor)

    def _coerce_value(self, value: Any, param: Any, ctx: Context) -> Any:
        converted = plain_value(self.descriptor, value)
        if converted is not _NOT_PLAIN:
            return converted
        if not self._typers:
            self._typers.append(build_runtime_param(self.descriptor))
        return self._typers[0]._coerce_value(value, param=param, ctx=ctx)


def plain_value(descriptor: TypeDescriptor, value: Any) -> Any:
    """`value` as typer converts it, when that conversion is plain; else `_NOT_PLAIN`."""
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        return _NOT_PLAIN
    annotation: Any = descriptor.annotation
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        if item is str and isinstance(value, list | tuple) and all(type(v) is str for v in value):
            return list(value)
        return _NOT_PLAIN
    if annotation is str:
        return value if type(value) is str else _NOT_PLAIN
    if annotation is int and not info.clamp:
        if type(value) is int:
            number = value
        elif type(value) is str and _INTEGER.fullmatch(value):
            number = int(value)
        else:
            return _NOT_PLAIN
        if (info.min is not None and number < info.min) or (
            info.max is not None and number > info.max
        ):
            return _NOT_PLAIN  # typer's words for what is out of range
        return number
    return _NOT_PLAIN


def _runtime_param(self: Any) -> RuntimeParam:
    if self._runtime_param is None:
        self._runtime_param = DirectParam.of(self.type_descriptor)
    return self._runtime_param  # type: ignore[no-any-return]


def install() -> None:
    """Convert every typer parameter's values through `DirectParam` from now on."""
    typer_core._TyperParameter.get_runtime_param = _runtime_param  # type: ignore[method-assign]


def installed() -> bool:
    """Whether `install` is in effect (typer still asks `get_runtime_param` for a conversion)."""
    return typer_core._TyperParameter.get_runtime_param is _runtime_param
