"""Ids read back from SQLite: the fast hex parse gives exactly what `uuid.UUID` gives."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql, sqlite

from corral.store._uuids import uuid_from_hex, uuid_result_processor


@given(st.integers(0, (1 << 128) - 1))
def test_a_stored_id_parses_to_the_same_uuid(number: int) -> None:
    expected = uuid.UUID(int=number)
    made = uuid_from_hex(expected.hex)
    assert (made, hash(made), str(made), made.hex, made.is_safe) == (
        expected,
        hash(expected),
        str(expected),
        expected.hex,
        expected.is_safe,
    )
    assert {made: 1}[expected] == 1


@pytest.mark.parametrize("text", ["", "abc", "g" * 32, "-" + "f" * 31, "z" * 40])
def test_what_is_not_an_id_is_refused_as_uuid_refuses_it(text: str) -> None:
    with pytest.raises(ValueError):
        uuid.UUID(text)
    with pytest.raises(ValueError):
        uuid_from_hex(text)


def test_other_forms_still_parse_through_uuid() -> None:
    value = uuid.uuid4()
    assert uuid_from_hex(str(value)) == value  # dashed: 36 characters, not a stored id


def test_the_fast_converter_is_for_sqlite_uuid_columns_only() -> None:
    convert = uuid_result_processor(sa.Uuid(), sqlite.dialect())
    assert convert is not None
    value = uuid.uuid4()
    assert convert(value.hex) == value
    assert convert(None) is None
    assert uuid_result_processor(sa.Uuid(), postgresql.asyncpg.dialect()) is None
    as_text = sa.Uuid(as_uuid=False)
    own = as_text._cached_result_processor(sqlite.dialect(), None)
    kept = uuid_result_processor(as_text, sqlite.dialect())
    assert own is not None and kept is not None
    assert kept(value.hex) == own(value.hex) == str(value)
