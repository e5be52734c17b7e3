"""The session spec: defaults, per-field validation and derived values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from corral.domain.bounds import (
    MAX_ARGUMENT_BYTES,
    MAX_COMMAND_ARGS,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_LENGTH,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
)
from corral.domain.field_errors import field_errors
from corral.domain.outcome import DependencyKind
from corral.domain.slots import ResourceSlots
from corral.domain.spec import ClusterMode, Dependency, SessionSpec, SessionType

_BASE: dict[str, Any] = {"image": "python", "command": ["python", "train.py"]}


def _spec(**fields: Any) -> SessionSpec:
    return SessionSpec.model_validate({**_BASE, **fields})


def _only_error(caught: pytest.ExceptionInfo[ValidationError]) -> dict[str, Any]:
    errors = caught.value.errors()
    assert len(errors) == 1, errors
    return dict(errors[0])


def test_minimal_spec_gets_defaults() -> None:
    """A spec with only image and command gets the documented defaults."""
    spec = _spec()
    assert spec.name is None
    assert spec.type is SessionType.BATCH
    assert spec.env == {}
    assert spec.resources == ResourceSlots({"cpu": 1, "mem": "1g"})
    assert spec.cluster_mode is ClusterMode.SINGLE_NODE
    assert spec.cluster_size == 1
    assert spec.priority == 0
    assert spec.resource_group == "default"
    assert spec.dependencies == []
    assert spec.starts_at is None
    assert spec.creation_id is None


def test_full_spec_is_accepted() -> None:
    """Every field set to a valid value is kept as given."""
    dependency = uuid.uuid4()
    spec = _spec(
        name="train-1.v2_a",
        type="INTERACTIVE",
        image="registry.example.com/team/img:tag",
        command=[],
        env={"HF_HOME": "/cache", "_x1": ""},
        resources="cpu=4,mem=16g,cuda.device=2",
        cluster_mode="multi-node",
        cluster_size=256,
        priority=-100,
        resource_group="gpu.a100",
        dependencies=[str(dependency)],
        starts_at="2030-01-01T09:00:00Z",
        creation_id="client 42: retry-safe",
    )
    assert spec.type is SessionType.INTERACTIVE
    assert spec.cluster_mode is ClusterMode.MULTI_NODE
    assert spec.resources == ResourceSlots.parse("cpu=4,mem=16g,cuda.device=2")
    assert spec.dependencies == [Dependency(session=dependency)]
    assert spec.starts_at == datetime(2030, 1, 1, 9, tzinfo=UTC)


@pytest.mark.parametrize("session_type", [SessionType.INTERACTIVE, SessionType.INFERENCE])
def test_non_batch_sessions_may_omit_command(session_type: SessionType) -> None:
    """INTERACTIVE and INFERENCE sessions need no command."""
    spec = SessionSpec(image="shell", type=session_type)
    assert spec.command == []


@pytest.mark.parametrize("fields", [{}, {"command": []}])
def test_batch_needs_a_command(fields: dict[str, Any]) -> None:
    """A BATCH session without a command is an error located at `command`."""
    with pytest.raises(ValidationError) as caught:
        SessionSpec.model_validate({"image": "python", **fields})
    error = _only_error(caught)
    assert error["loc"] == ("command",)
    assert "BATCH sessions need a command" in error["msg"]


def test_invalid_type_does_not_also_blame_command() -> None:
    """A bad `type` is reported at `type` alone, not as a missing BATCH command too."""
    with pytest.raises(ValidationError) as caught:
        SessionSpec.model_validate({"image": "python", "type": "NOPE"})
    assert _only_error(caught)["loc"] == ("type",)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("name", "", "use 1 to 64 letters"),
        ("name", "-leading-dash", "starting with a letter or digit"),
        ("name", "has space", "is invalid"),
        ("name", "x" * 65, "is invalid"),
        ("type", "batch", "Input should be"),
        ("image", "", "image must be 1 to 256 characters"),
        ("image", "py thon", "without whitespace"),
        ("image", "i" * 257, "1 to 256 characters"),
        ("command", ["", "x"], "must not be empty"),
        ("command", "python train.py", "valid list"),
        ("env", {"1BAD": "x"}, "env name '1BAD' is invalid"),
        ("env", {"BAD-NAME": "x"}, "env name 'BAD-NAME' is invalid"),
        ("env", {"CORRAL_SESSION_ID": "x"}, "env name 'CORRAL_SESSION_ID' is reserved"),
        ("env", {"corral_token": "x"}, "env name 'corral_token' is reserved"),
        ("env", {"OK": "a\0b"}, "NUL characters"),
        ("resources", "cpu=2g", "slot 'cpu'"),
        ("resources", {"mem": -1}, "slot 'mem': must not be negative"),
        ("resources", "cpu=0", "at least one slot"),
        ("cluster_mode", "multi", "Input should be"),
        ("cluster_size", 0, "greater than or equal to 1"),
        ("cluster_size", 257, "less than or equal to 256"),
        ("priority", -101, "greater than or equal to -100"),
        ("priority", 101, "less than or equal to 100"),
        ("resource_group", "", "resource_group '' is invalid"),
        ("resource_group", "a/b", "is invalid"),
        ("starts_at", "2030-01-01T09:00:00", "starts_at must include a timezone"),
        ("starts_at", datetime(2030, 1, 1), "must include a timezone"),
        ("creation_id", "", "creation_id must be 1 to 128 printable characters"),
        ("creation_id", "x" * 129, "1 to 128 printable"),
        ("creation_id", "tab\there", "printable"),
        ("workdir", "relative/dir", "workdir must be an absolute path"),
        ("workdir", "/a\0b", "must not contain NUL"),
        ("workdir", "/a\ud800", "lone surrogate"),
        ("image", "py\0", "must not contain NUL"),
        ("image", "py\udc80", "lone surrogate"),
        ("command", ["python", "\ud800"], "lone surrogate"),
        ("command", ["python", "a\0"], "must not contain NUL"),
        ("command", ["x" * (MAX_ARGUMENT_BYTES + 1)], f"at most {MAX_ARGUMENT_BYTES} bytes"),
        ("command", ["é" * (MAX_ARGUMENT_BYTES // 2 + 1)], f"at most {MAX_ARGUMENT_BYTES} bytes"),
        ("command", ["x" * 100_000] * 11, f"at most {MAX_COMMAND_BYTES} bytes in all"),
        ("command", ["x"] * (MAX_COMMAND_ARGS + 1), f"at most {MAX_COMMAND_ARGS} arguments"),
        ("env", {"OK": "\ud800"}, "lone surrogate"),
        ("env", {f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}, f"at most {MAX_ENV_VARS}"),
        ("env", {"A" * (MAX_ENV_NAME_LENGTH + 1): "x"}, "is invalid"),
        ("env", {"OK": "x" * (MAX_ENV_VALUE_BYTES + 1)}, f"at most {MAX_ENV_VALUE_BYTES} bytes"),
        ("env", {f"V{i}": "x" * 100_000 for i in range(11)}, f"at most {MAX_ENV_BYTES} bytes"),
        ("starts_at", "9999-12-31T23:59:59-14:00", "between 1970-01-01 and 3000-01-01"),
        ("starts_at", "3000-01-01T00:00:00Z", "between 1970-01-01 and 3000-01-01"),
        ("starts_at", "1969-12-31T23:59:59Z", "between 1970-01-01 and 3000-01-01"),
        ("creation_id", "a\ud800", "printable"),
        ("creation_id", "a\0", "printable"),
        ("workdir", "/" + "d" * 4096, "at most 4096 characters"),
        ("unknown_field", 1, "Extra inputs are not permitted"),
    ],
)
def test_invalid_field_is_located_at_that_field(field: str, value: Any, fragment: str) -> None:
    """Each invalid field gives one error whose loc names that field and says what is wrong."""
    with pytest.raises(ValidationError) as caught:
        _spec(**{field: value})
    error = _only_error(caught)
    assert error["loc"] == (field,)
    assert fragment in error["msg"]


def test_image_is_required() -> None:
    """A spec without an image is an error located at `image`."""
    with pytest.raises(ValidationError) as caught:
        SessionSpec.model_validate({"command": ["true"]})
    assert _only_error(caught)["loc"] == ("image",)


def test_duplicate_dependencies_rejected() -> None:
    """The same dependency listed twice is an error located at `dependencies`."""
    dependency = uuid.uuid4()
    with pytest.raises(ValidationError) as caught:
        _spec(dependencies=[dependency, dependency])
    error = _only_error(caught)
    assert error["loc"] == ("dependencies",)
    assert f"dependency {dependency} is listed twice" in error["msg"]


def test_dependencies_limited_to_64() -> None:
    """64 dependencies are accepted; 65 are an error located at `dependencies`."""
    assert len(_spec(dependencies=[uuid.uuid4() for _ in range(64)]).dependencies) == 64
    with pytest.raises(ValidationError) as caught:
        _spec(dependencies=[uuid.uuid4() for _ in range(65)])
    error = _only_error(caught)
    assert error["loc"] == ("dependencies",)
    assert "at most 64" in error["msg"]


def test_malformed_dependency_located_at_its_index() -> None:
    """A dependency that is not a UUID is reported at its position in the list."""
    with pytest.raises(ValidationError) as caught:
        _spec(dependencies=[str(uuid.uuid4()), "not-a-uuid"])
    assert _only_error(caught)["loc"][:2] == ("dependencies", 1)


def test_dependencies_are_ids_or_objects_with_a_kind() -> None:
    """A bare id is afterok; an object names its kind; an unknown kind names its place."""
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    spec = _spec(
        dependencies=[str(a), {"session": str(b), "kind": "afterany"}, {"session": str(c)}]
    )
    assert [(d.session, d.kind) for d in spec.dependencies] == [
        (a, DependencyKind.AFTEROK),
        (b, DependencyKind.AFTERANY),
        (c, DependencyKind.AFTEROK),
    ]
    with pytest.raises(ValidationError) as caught:
        _spec(dependencies=[{"session": str(a), "kind": "after"}])
    assert _only_error(caught)["loc"] == ("dependencies", 0, "kind")
    with pytest.raises(ValidationError) as twice:
        _spec(dependencies=[str(a), {"session": str(a), "kind": "afternotok"}])
    assert "listed twice" in _only_error(twice)["msg"]


def test_starts_at_is_normalised_to_utc() -> None:
    """An aware starts_at in another zone is stored as the same instant in UTC."""
    paris_summer = timezone(timedelta(hours=2))
    spec = _spec(starts_at=datetime(2030, 6, 1, 11, 30, tzinfo=paris_summer))
    assert spec.starts_at == datetime(2030, 6, 1, 9, 30, tzinfo=UTC)
    assert spec.starts_at is not None
    assert spec.starts_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("resources", "cluster_size", "total"),
    [
        ("cpu=2,mem=4g", 1, "cpu=2,mem=4g"),
        ("cpu=2,mem=4g", 3, "cpu=6,mem=12g"),
        ("cpu=0.5,cuda.device=1", 4, "cpu=2,cuda.device=4"),
    ],
)
def test_total_resources(resources: str, cluster_size: int, total: str) -> None:
    """total_resources is the per-kernel resources times the cluster size."""
    spec = _spec(resources=resources, cluster_size=cluster_size)
    assert spec.total_resources == ResourceSlots.parse(total)


def test_spec_is_frozen() -> None:
    """A validated spec cannot be changed afterwards."""
    spec = _spec()
    with pytest.raises(ValidationError):
        spec.priority = 5  # type: ignore[misc]


def test_json_round_trip() -> None:
    """A spec dumped to JSON validates back to an equal spec."""
    spec = _spec(
        resources="cpu=0.5,mem=1.5g",
        dependencies=[uuid.uuid4()],
        starts_at=datetime(2030, 1, 1, tzinfo=UTC),
        env={"A": "1"},
    )
    dumped = spec.model_dump_json()
    assert '"resources":{"cpu":0.5,"mem":1610612736}' in dumped
    assert SessionSpec.model_validate_json(dumped) == spec


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"command": ["python", "ok", "\ud800"]}, "command.2"),
        ({"env": {"GOOD": "x", "BAD": "\0"}}, "env.BAD"),
        ({"resources": {"cpu": 10**13}, "cluster_size": 101}, "resources.cpu"),
        ({"resources": {"mem": "1Pi"}}, "resources.mem"),
    ],
)
def test_bounds_name_the_exact_field(fields: dict[str, Any], where: str) -> None:
    """An argument, an env value or a slot past corral's bounds is named down to its key."""
    with pytest.raises(ValidationError) as caught:
        _spec(**fields)
    assert [error.field for error in field_errors(caught.value)] == [where]


def test_a_session_at_every_limit_is_accepted() -> None:
    """The bounds are inclusive: a command and an env exactly at their limits are valid."""
    argument = "x" * (MAX_ARGUMENT_BYTES - 1)
    spec = _spec(
        command=["python", *[argument] * (MAX_COMMAND_BYTES // MAX_ARGUMENT_BYTES - 1)],
        env={f"V{i}": "y" * 1000 for i in range(MAX_ENV_VARS)},
        resources={"cpu": 10**13},
        cluster_size=100,
        starts_at="2999-12-31T23:59:59Z",
    )
    assert spec.total_resources["cpu"] == 10**15
