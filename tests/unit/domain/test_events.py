"""Event payloads as plain JSON values, the same whichever way they are made."""

from __future__ import annotations

import enum
import json
import uuid
from datetime import UTC, datetime

import pytest

from corral.domain.events import jsonable_payload


class Colour(enum.StrEnum):
    RED = "red"


def test_a_flat_payload_of_plain_values_is_copied_as_it_is() -> None:
    """The fast path: equal to the JSON round trip, and a copy, not the caller's dict."""
    payload = {"from": "PENDING", "to": "SCHEDULED", "n": 3, "x": 1.5, "ok": True, "none": None}
    result = jsonable_payload(payload)
    assert result == json.loads(json.dumps(payload))
    assert result is not payload


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        (datetime(2030, 1, 1, tzinfo=UTC), "2030-01-01T00:00:00+00:00"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (Colour.RED, "red"),
        ({"nested": (1, 2)}, {"nested": [1, 2]}),
    ],
)
def test_other_values_become_what_json_gives_back(value: object, plain: object) -> None:
    """Datetimes, ids, enums (even str ones) and containers are converted, never kept."""
    result = jsonable_payload({"value": value})
    assert result == {"value": plain}
    assert type(result["value"]) is type(plain)
