"""Session and kernel ids: UUID version 7, ordered by the time they were made."""

from __future__ import annotations

import time
import uuid

from hypothesis import given
from hypothesis import strategies as st

from corral.domain.types import new_kernel_id, new_session_id, time_ordered_uuid

# From 1970 to the year 10889, where the 48 bits of milliseconds end. The twelve bits of a
# millisecond's fraction step every 244.14 ns: ids 245 ns apart are always ordered.
_NS = st.integers(min_value=0, max_value=(1 << 48) * 1_000_000 - 1)


@given(_NS, st.integers(min_value=245, max_value=10**12))
def test_an_id_made_later_sorts_later_as_int_bytes_and_text(now_ns: int, later_by: int) -> None:
    first = time_ordered_uuid(now_ns)
    second = time_ordered_uuid(now_ns + later_by)
    if now_ns + later_by < (1 << 48) * 1_000_000:
        assert first < second
        assert first.bytes < second.bytes
        assert str(first) < str(second)
        assert first.hex < second.hex


@given(_NS)
def test_the_fields_are_those_of_rfc_9562_version_7(now_ns: int) -> None:
    made = time_ordered_uuid(now_ns)
    assert made.version == 7
    assert made.variant == uuid.RFC_4122
    assert made.int >> 80 == now_ns // 1_000_000  # the Unix time in milliseconds


def test_ids_made_at_the_same_instant_differ() -> None:
    now_ns = time.time_ns()
    assert len({time_ordered_uuid(now_ns) for _ in range(1_000)}) == 1_000


def test_session_and_kernel_ids_carry_the_clock_s_time() -> None:
    before_ms = time.time_ns() // 1_000_000
    made = [new_session_id(), new_kernel_id()]
    after_ms = time.time_ns() // 1_000_000
    for made_id in made:
        assert made_id.version == 7
        assert before_ms <= made_id.int >> 80 <= after_ms
