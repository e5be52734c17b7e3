"""The store's JSON text is `json.dumps`'s, byte for byte, and refuses what it refuses."""

from __future__ import annotations

import enum
import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.store._json import dumps


class _Kind(enum.StrEnum):
    BATCH = "batch"


_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text() | st.integers() | st.booleans(), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_VALUES)
def test_the_text_is_json_dumps_text(value: Any) -> None:
    assert dumps(value) == json.dumps(value)


@pytest.mark.parametrize(
    "value",
    [{"type": _Kind.BATCH}, _Kind.BATCH, 'é\n"', float("nan"), {"a": {}, "b": []}, ()],
)
def test_enums_escapes_and_special_floats_as_json_dumps_writes_them(value: Any) -> None:
    assert dumps(value) == json.dumps(value)


@pytest.mark.parametrize("value", [uuid.uuid4(), {"a": {1, 2}}, {(1, 2): 3}, object()])
def test_what_json_dumps_refuses_is_refused(value: Any) -> None:
    with pytest.raises(TypeError) as expected:
        json.dumps(value)
    with pytest.raises(TypeError) as got:
        dumps(value)
    assert str(got.value) == str(expected.value)
