"""Job files: a session (or a job array) written as YAML or TOML, for `corral submit`.

A job file holds the fields of the API's session spec (`SessionSpec`: the one model both
validate against, so a field added there is a job-file field at once) plus `array`, Slurm's
array syntax; `image` may be left out, as with `corral run` (`python`, or `shell` for a one-line
script). An error names the file, the line and the field: `job.yaml:7: resources: ...`. YAML
lines come from PyYAML's nodes, which carry their marks; TOML lines from the key path, found
in the text (tomllib keeps no positions).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator

from corral.domain.arrays import ARRAY_SCHEMA, check_array
from corral.domain.dependency_syntax import DependencySyntaxError, parse_after
from corral.domain.images import default_image
from corral.domain.spec import SessionSpec

YAML_SUFFIXES = (".yaml", ".yml")
TOML_SUFFIXES = (".toml",)
_SLOT_MESSAGE = re.compile(r"slot '([^']+)': (.*)", re.DOTALL)


def _image_optional(schema: dict[str, Any]) -> None:
    """The schema as users write it: `image` may be left out (see `JobSpec._default_image`)."""
    required = schema.get("required", [])
    if "image" in required:
        required.remove("image")
    schema["properties"]["image"]["description"] = (
        "default: python, or shell for a command of one argument with shell syntax"
    )


class JobSpec(SessionSpec):
    """A job file's contents: a session spec, and `array` to make it a job array."""

    model_config = ConfigDict(json_schema_extra=_image_optional, title="corral job file")

    # Slurm's syntax: 0-99, 1,3,5, 0-15:4, with %N for at most N at once (0-999%50).
    array: str | None = Field(default=None, json_schema_extra=ARRAY_SCHEMA)
    # Sessions to wait for, as `corral run --after` takes them; resolved at submission and
    # added to `dependencies` (which names sessions by id only).
    after: list[str] | None = Field(
        default=None,
        description="sessions to wait for, as `corral run --after` takes them: a number, name, "
        "id or array element (12_7), afterok by default, or KIND:REF[:REF...] with kind "
        "afterok, afterany or afternotok; a job array's number waits for every element",
        examples=[["12", "afterany:13:prep", "afternotok:12_3"]],
    )

    @model_validator(mode="before")
    @classmethod
    def _default_image(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "image" not in data:
            command = data.get("command")
            words = command if isinstance(command, list) else []
            return {**data, "image": default_image([str(word) for word in words])}
        return data

    @field_validator("array")
    @classmethod
    def _check_array(cls, value: str | None) -> str | None:
        return None if value is None else check_array(value)

    @field_validator("after", mode="before")
    @classmethod
    def _check_after(cls, value: Any) -> Any:
        if isinstance(value, str | int):  # one reference, or a comma-separated line of them
            value = [str(value)]
        if isinstance(value, list):
            value = [str(item) if isinstance(item, int) else item for item in value]
            try:
                parse_after(item for item in value if isinstance(item, str))
            except DependencySyntaxError as exc:
                raise ValueError(str(exc).replace("--after ", "", 1)) from None
        return value


class JobFileError(ValueError):
    """A job file that cannot be read or is not valid; each line of the message names the file,
    the line (when known) and the field."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def job_schema() -> dict[str, Any]:
    """The JSON schema of a job file (`corral submit --schema`)."""
    return JobSpec.model_json_schema()


def load_job_file(path: Path) -> JobSpec:
    """Read and validate the job file at `path` (YAML or TOML, by its suffix)."""
    name = path.name
    suffix = path.suffix.lower()
    if suffix not in YAML_SUFFIXES + TOML_SUFFIXES:
        raise JobFileError(
            [f"{name}: a job file ends in .yaml, .yml or .toml (it says which language it is)"]
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError([f"{name}: cannot read it: {exc}"]) from None
    if suffix in YAML_SUFFIXES:
        data, line_of = _parse_yaml(name, text)
    else:
        data, line_of = _parse_toml(name, text)
    if not isinstance(data, dict):
        raise JobFileError([f"{name}:1: a job file is a mapping of fields, like `command: [...]`"])
    try:
        return JobSpec.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = [_problem(name, line_of, tuple(e["loc"]), e["msg"]) for e in exc.errors()]
        problems.sort(key=lambda found: found[0] or 0)  # in the order of the file
        raise JobFileError([text for _, text in problems]) from None


def _problem(
    name: str, line_of: _LineFinder, loc: tuple[Any, ...], message: str
) -> tuple[int | None, str]:
    # Resources are validated as a whole; their messages name the slot, which is the field.
    slot = _SLOT_MESSAGE.match(message.removeprefix("Value error, "))
    if slot is not None:
        loc, message = (*loc, slot[1]), slot[2]
    field = ".".join(str(part) for part in loc) or "file"
    line = line_of(loc)
    where = f"{name}:{line}" if line is not None else name
    return line, f"{where}: {field}: {message.removeprefix('Value error, ')}"


# The line (1-based) where the value at a key path is written, or the nearest enclosing one
# that is; None when not even the first key is in the file.
_LineFinder = Callable[[tuple[Any, ...]], int | None]


class _YamlLines:
    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def __call__(self, loc: tuple[Any, ...]) -> int | None:
        node = self.root
        if node is None:
            return None
        line = node.start_mark.line + 1
        for part in loc:
            child = _yaml_child(node, part)
            if child is None:
                break
            node = child
            line = node.start_mark.line + 1
        return line


def _yaml_child(node: yaml.Node, part: Any) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                found: yaml.Node = value
                return found
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        item: yaml.Node = node.value[part]
        return item
    return None


def _parse_yaml(name: str, text: str) -> tuple[Any, _LineFinder]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise JobFileError([f"{name}{line}: not valid YAML: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise JobFileError([f"{name}: not valid YAML: {exc}"]) from None
    return data, _YamlLines(root)


_TOML_ERROR_LINE = re.compile(r"\(at line (\d+), column \d+\)$")
_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"' ]+?)\s*=")


class _TomlLines:
    """Lines of a TOML document's keys: `[table]` headers and `key =` lines, by dotted path.

    A value in an inline table or an array is placed on the line of its key.
    """

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            header = _TOML_TABLE.match(line)
            if header is not None:
                table = _dotted(header[1])
                self.lines.setdefault(table, number)
                continue
            key = _TOML_KEY.match(line)
            if key is not None:
                self.lines.setdefault(table + _dotted(key[1]), number)

    def __call__(self, loc: tuple[Any, ...]) -> int | None:
        path = tuple(str(part) for part in loc)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def _dotted(key: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in key.split("."))


def _parse_toml(name: str, text: str) -> tuple[Any, _LineFinder]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_ERROR_LINE.search(message)
        line = f":{found[1]}" if found is not None else ""
        problem = _TOML_ERROR_LINE.sub("", message).strip()
        raise JobFileError([f"{name}{line}: not valid TOML: {problem}"]) from None
    return data, _TomlLines(text)
