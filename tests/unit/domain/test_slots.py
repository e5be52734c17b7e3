"""Resource slots: parsing, arithmetic, serialisation and the pydantic field type."""

from __future__ import annotations

import copy
import json
import pickle
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from corral.domain.slots import (
    MAX_AMOUNT,
    MAX_FRACTIONAL_AMOUNT,
    ResourceSlots,
    SlotError,
    is_byte_slot,
    parse_amount,
)

GIB = 1024**3
GB = 10**9

# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cpu=2", {"cpu": 2}),
        ("cpu=0.5", {"cpu": Decimal("0.5")}),
        ("cpu=.25", {"cpu": Decimal("0.25")}),
        ("cpu=2,mem=4g,cuda.device=1", {"cpu": 2, "mem": 4 * GIB, "cuda.device": 1}),
        (" cpu = 2 ,  mem=4Gi ", {"cpu": 2, "mem": 4 * GIB}),
        ("cpu=2 mem=4GiB", {"cpu": 2, "mem": 4 * GIB}),
        # Kubernetes: decimal suffixes as Kubernetes spells them, binary ones with an i.
        ("cpu=500m", {"cpu": Decimal("0.5")}),
        ("cpu=1500m", {"cpu": Decimal("1.5")}),
        ("cpu=2k", {"cpu": 2000}),
        ("cpu=1Ki", {"cpu": 1024}),
        ("cpu=1e3", {"cpu": 1000}),
        ("cpu=25e-2", {"cpu": Decimal("0.25")}),
        ("cpu=500000u", {"cpu": Decimal("0.5")}),
        ("mem=4G", {"mem": 4 * GB}),
        ("mem=4GB", {"mem": 4 * GB}),
        ("mem=512M", {"mem": 512 * 10**6}),
        ("mem=4kB", {"mem": 4000}),
        ("mem=1T", {"mem": 10**12}),
        ("mem=1P", {"mem": 10**15}),
        ("mem=4Gi", {"mem": 4 * GIB}),
        ("mem=2KiB", {"mem": 2048}),
        ("mem=1.5Gi", {"mem": 3 * GIB // 2}),
        ("mem=1e9", {"mem": GB}),
        # The old spellings of byte slots keep their binary meaning: `512m` is not milli.
        ("mem=4g", {"mem": 4 * GIB}),
        ("mem=4gb", {"mem": 4 * GIB}),
        ("mem=4gib", {"mem": 4 * GIB}),
        ("mem=4Gb", {"mem": 4 * GIB}),
        ("mem=512m", {"mem": 512 * 1024**2}),
        ("mem=1k", {"mem": 1024}),
        ("mem=1K", {"mem": 1024}),
        ("mem=1KB", {"mem": 1024}),
        ("mem=1t", {"mem": 1024**4}),
        ("mem=1.5g", {"mem": 3 * GIB // 2}),
        ("mem=0.1k", {"mem": 103}),
        ("mem=4096", {"mem": 4096}),
        ("cuda.mem=2g", {"cuda.mem": 2 * GIB}),
        ("cuda.shares=0.25", {"cuda.shares": Decimal("0.25")}),
        ("cpu=0,mem=1g", {"mem": GIB}),
        ("", {}),
        ("   ", {}),
    ],
)
def test_parse_valid(text: str, expected: dict[str, int | Decimal]) -> None:
    """Valid slot text parses to the expected amounts, with binary units for byte slots."""
    assert ResourceSlots.parse(text) == ResourceSlots({k: Decimal(v) for k, v in expected.items()})


@pytest.mark.parametrize(
    ("text", "slot", "fragment"),
    [
        ("mem=4x", "mem", "unknown unit 'x' in '4x'; mem takes bytes like 4294967296, or a size"),
        ("mem=4kk", "mem", "unknown unit 'kk'"),
        ("mem=4b", "mem", "unknown unit 'b'"),
        ("mem=4u", "mem", "unknown unit 'u'"),
        ("cpu=2g", "cpu", "unknown unit 'g' in '2g'; cpu takes a number like 2 or 0.5, or a "),
        ("cpu=2GB", "cpu", "unknown unit 'GB'"),
        ("cpu=-1", "cpu", "must not be negative (got -1)"),
        ("mem=-1k", "mem", "must not be negative (got -1k)"),
        ("cpu", "cpu", "missing '='"),
        ("cpu=1,cpu=2", "cpu", "given more than once"),
        ("cpu=abc", "cpu", "'abc' is not a quantity; cpu takes a number like 2 or 0.5"),
        ("cpu=1e100", "cpu", "is not a quantity"),
        ("cpu=nan", "cpu", "is not a quantity"),
        ("cpu=Infinity", "cpu", "is not a quantity"),
        ("mem=inf", "mem", "is not a size"),
        ("mem=2Pi", "mem", "2Pi is more than corral handles; at most 1P"),
        ("mem=1E", "mem", "more than corral handles"),
        ("cpu=1e16", "cpu", "more than corral handles"),
        ("cpu=1000000000000.5", "cpu", "an amount with a fraction must be below 10¹²"),
        ("mem=g", "mem", "is not a size"),
        ("cpu=", "cpu", "missing amount"),
        ("CPU=1", "CPU", "invalid name"),
        ("cuda..device=1", "cuda..device", "invalid name"),
        ("1cpu=1", "1cpu", "invalid name"),
    ],
)
def test_parse_invalid_names_the_slot(text: str, slot: str, fragment: str) -> None:
    """Invalid slot text raises SlotError naming the slot and saying what is wrong."""
    with pytest.raises(SlotError) as caught:
        ResourceSlots.parse(text)
    assert f"slot {slot!r}" in str(caught.value)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("=2", "empty slot name"), ("cpu=1,,mem=1g", "empty resource item")],
)
def test_parse_invalid_without_a_slot_name(text: str, fragment: str) -> None:
    """Items with no slot name at all still raise SlotError that says how to write one."""
    with pytest.raises(SlotError, match=fragment):
        ResourceSlots.parse(text)


def test_parse_items_reads_separate_flags() -> None:
    """parse_items takes one name=amount per item, as repeated CLI flags give them."""
    parsed = ResourceSlots.parse_items(["cpu=2", " mem=512m "])
    assert parsed == ResourceSlots({"cpu": 2, "mem": 512 * 1024**2})


def test_parse_items_rejects_duplicates() -> None:
    """The same slot given twice across items is an error naming the slot."""
    with pytest.raises(SlotError, match="slot 'cpu': given more than once"):
        ResourceSlots.parse_items(["cpu=2", "cpu=3"])


# --- construction ----------------------------------------------------------------------------


def test_constructor_accepts_decimal_int_and_str() -> None:
    """The constructor takes Decimal, int and str amounts, str with units for byte slots."""
    slots = ResourceSlots({"cpu": Decimal("0.5"), "cuda.device": 1, "mem": "1g"})
    assert dict(slots) == {"cpu": Decimal("0.5"), "cuda.device": Decimal(1), "mem": Decimal(GIB)}


@pytest.mark.parametrize("value", [0.5, 1.0, True, None, [1]])
def test_constructor_rejects_float_and_other_types(value: object) -> None:
    """Floats (binary rounding) and non-numbers are a TypeError naming the slot."""
    with pytest.raises(TypeError, match="slot 'cpu'"):
        ResourceSlots({"cpu": value})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("amounts", "fragment"),
    [
        ({"cpu": Decimal(-1)}, "slot 'cpu': must not be negative (got -1)"),
        ({"cpu": -1}, "slot 'cpu': must not be negative (got -1)"),
        ({"cpu": 10**15 + 1}, "slot 'cpu': 1000000000000001 is more than corral handles"),
        ({"cpu": Decimal("NaN")}, "slot 'cpu': amount must be a finite number"),
        ({"gpu": Decimal("Infinity")}, "slot 'gpu': amount must be a finite number"),
        ({"Bad Name": 1}, "slot 'Bad Name': invalid name"),
    ],
)
def test_constructor_rejects_invalid_amounts(
    amounts: dict[str, Decimal | int], fragment: str
) -> None:
    """Negative, non-finite amounts and malformed names raise SlotError naming the slot."""
    with pytest.raises(SlotError) as caught:
        ResourceSlots(amounts)
    assert fragment in str(caught.value)


def test_slot_error_is_a_value_error() -> None:
    """SlotError is a ValueError, so callers and pydantic treat it as bad input."""
    assert issubclass(SlotError, ValueError)


def test_slot_error_carries_the_slot_and_the_problem() -> None:
    """A SlotError names its slot apart from the problem, so callers can place it (a field)."""
    with pytest.raises(SlotError) as caught:
        ResourceSlots.parse("cpu=1,mem=-4Gi")
    assert (caught.value.slot, caught.value.problem) == ("mem", "must not be negative (got -4Gi)")


@pytest.mark.parametrize(
    ("name", "text", "amount"),
    [("cpu", "500m", Decimal("0.5")), ("mem", " 512m ", 512 * 1024**2), ("mem", "4G", 4 * GB)],
)
def test_parse_amount_reads_one_slot(name: str, text: str, amount: Decimal | int) -> None:
    """parse_amount reads one flag's value, e.g. `--mem 512m`, by the same rules as parse."""
    assert parse_amount(name, text) == amount


def test_byte_slots_round_up_to_whole_bytes() -> None:
    """A fractional byte amount rounds up to the next whole byte; counts keep fractions."""
    slots = ResourceSlots({"mem": Decimal("1.2"), "cuda.mem": "0.5", "cpu": Decimal("1.2")})
    assert slots["mem"] == 2
    assert slots["cuda.mem"] == 1
    assert slots["cpu"] == Decimal("1.2")


@pytest.mark.parametrize(
    ("name", "is_bytes"),
    [("mem", True), ("cuda.mem", True), ("cpu", False), ("memory", False), ("mem.count", False)],
)
def test_is_byte_slot(name: str, is_bytes: bool) -> None:
    """Byte slots are `mem` and slots whose last dotted part is `mem`."""
    assert is_byte_slot(name) is is_bytes


def test_missing_slot_equals_zero() -> None:
    """A missing slot compares equal to a zero slot, and hashes the same."""
    assert ResourceSlots({"cpu": 1}) == ResourceSlots({"cpu": 1, "mem": 0})
    assert hash(ResourceSlots({"cpu": 1})) == hash(ResourceSlots({"cpu": "1.0", "mem": 0}))
    assert len(ResourceSlots({"cpu": 1, "mem": 0})) == 1
    assert ResourceSlots({"cpu": 1}) != ResourceSlots({"cpu": 2})


def test_is_immutable_and_copies_intact() -> None:
    """Attributes cannot be set, and copy and pickle give back an equal value."""
    slots = ResourceSlots({"cpu": 2, "mem": "1g"})
    with pytest.raises(AttributeError):
        slots._amounts = {}
    assert copy.deepcopy(slots) == slots
    assert pickle.loads(pickle.dumps(slots)) == slots


# --- arithmetic ------------------------------------------------------------------------------


def test_add_and_subtract_slot_wise() -> None:
    """Addition and subtraction work slot by slot, treating missing slots as zero."""
    a = ResourceSlots({"cpu": 2, "mem": "4g"})
    b = ResourceSlots({"cpu": "0.5", "cuda.device": 1})
    assert a + b == ResourceSlots({"cpu": "2.5", "mem": "4g", "cuda.device": 1})
    assert (a + b) - b == a
    assert a - a == ResourceSlots.zero()


def test_decimal_arithmetic_is_exact() -> None:
    """0.1 + 0.2 cpu is exactly 0.3 cpu, with no binary rounding."""
    total = ResourceSlots({"cpu": "0.1"}) + ResourceSlots({"cpu": "0.2"})
    assert total == ResourceSlots({"cpu": "0.3"})


def test_subtract_below_zero_names_the_slot() -> None:
    """Taking more than is there raises SlotError naming the slot that would go negative."""
    with pytest.raises(SlotError) as caught:
        ResourceSlots({"cpu": 4}) - ResourceSlots({"cpu": 1, "cuda.device": 1})
    assert "slot 'cuda.device': cannot take 1 from 0" in str(caught.value)


@pytest.mark.parametrize(
    ("factor", "expected"),
    [(0, {}), (1, {"cpu": "0.5", "mem": "1g"}), (4, {"cpu": "2", "mem": "4g"})],
)
def test_multiply_by_count(factor: int, expected: dict[str, str]) -> None:
    """Multiplying by n gives n kernels' worth of resources, from either side."""
    slots = ResourceSlots({"cpu": "0.5", "mem": "1g"})
    assert slots * factor == ResourceSlots(expected)
    assert factor * slots == ResourceSlots(expected)


@pytest.mark.parametrize("factor", [-1, 1.5, True])
def test_multiply_rejects_negative_and_non_integers(factor: object) -> None:
    """Only integers 0 and above multiply slots."""
    with pytest.raises((SlotError, TypeError)):
        ResourceSlots({"cpu": 1}) * factor  # type: ignore[operator]


@pytest.mark.parametrize(
    ("request_", "capacity", "fits"),
    [
        ("cpu=2,mem=4g", "cpu=4,mem=8g", True),
        ("cpu=4,mem=8g", "cpu=4,mem=8g", True),
        ("cpu=4.5", "cpu=4,mem=8g", False),
        ("cpu=1,cuda.device=1", "cpu=4,mem=8g", False),
        ("", "", True),
        ("", "cpu=1", True),
        ("cpu=0.1", "", False),
    ],
)
def test_fits_in(request_: str, capacity: str, fits: bool) -> None:
    """A request fits when no slot exceeds capacity; a slot missing from capacity is zero."""
    assert ResourceSlots.parse(request_).fits_in(ResourceSlots.parse(capacity)) is fits


def test_zero_names_and_is_zero() -> None:
    """zero() has no slots; names() lists the non-zero slots."""
    assert ResourceSlots.zero().is_zero()
    assert not ResourceSlots({"cpu": 1}).is_zero()
    assert ResourceSlots({"cpu": 1, "mem": 0, "tpu": 2}).names() == frozenset({"cpu", "tpu"})


# --- serialisation ---------------------------------------------------------------------------


def test_to_json_gives_numbers_in_base_units() -> None:
    """to_json: whole amounts as ints (bytes for mem), fractional ones as floats."""
    slots = ResourceSlots({"cpu": Decimal("0.50"), "mem": Decimal("4E+9"), "tpu": Decimal("1E+2")})
    assert slots.to_json() == {"cpu": 0.5, "mem": 4000000000, "tpu": 100}
    assert [type(v) for v in slots.to_json().values()] == [float, int, int]
    assert ResourceSlots.from_json(slots.to_json()) == slots


def test_to_text_uses_canonical_decimal_strings() -> None:
    """to_text gives plain decimal strings with no exponent and no trailing zeros."""
    slots = ResourceSlots({"cpu": Decimal("0.50"), "mem": Decimal("4E+9")})
    assert slots.to_text() == {"cpu": "0.5", "mem": "4000000000"}


def test_from_json_accepts_numbers_and_quantity_strings() -> None:
    """from_json reads ints, JSON floats as the decimal they print as, and quantity strings."""
    expected = ResourceSlots({"cpu": Decimal("0.1"), "mem": 1024})
    assert ResourceSlots.from_json({"cpu": 0.1, "mem": 1024}) == expected
    assert ResourceSlots.from_json({"cpu": "100m", "mem": "1Ki"}) == expected
    assert ResourceSlots.from_json({"cpu": "0.1", "mem": "1k"}) == expected


@pytest.mark.parametrize(
    ("text", "human"),
    [
        ("cpu=2,mem=4g,cuda.device=1", "cpu=2 mem=4GiB cuda.device=1"),
        ("cuda.device=1,mem=4g,cpu=2", "cpu=2 mem=4GiB cuda.device=1"),
        ("mem=1.5g", "mem=1536MiB"),
        ("mem=0.1k", "mem=103"),
        ("mem=4G", "mem=4GB"),
        ("mem=1000", "mem=1kB"),
        ("cuda.mem=2t", "cuda.mem=2TiB"),
        ("mem=1P", "mem=1PB"),
        ("cpu=500m", "cpu=0.5"),
        ("cpu=0.25", "cpu=0.25"),
        ("", ""),
    ],
)
def test_format_human(text: str, human: str) -> None:
    """Bytes show in the largest binary unit dividing them exactly; cpu and mem lead."""
    assert ResourceSlots.parse(text).format_human() == human


@pytest.mark.parametrize(
    ("text", "brief"),
    [
        ("cpu=2,mem=24684084k", "cpu=2 mem=23.5GiB"),  # a host's memory, as detected
        ("mem=3000000k", "mem=3072MB"),
        ("mem=3000001k", "mem=2.9GiB"),
        ("mem=4g,cuda.device=2", "mem=4GiB cuda.device=2"),
        ("mem=512m", "mem=512MiB"),
        ("mem=1.5g", "mem=1.5GiB"),
        ("mem=4G", "mem=4GB"),
        ("mem=1001", "mem=1001"),
        ("cpu=0.25", "cpu=0.25"),
    ],
)
def test_format_brief(text: str, brief: str) -> None:
    """For tables: byte amounts no unit divides are rounded to a tenth of their largest unit;
    whole amounts, small ones and other slots read as format_human writes them."""
    assert ResourceSlots.parse(text).format_brief() == brief


def test_repr_round_trips() -> None:
    """repr shows amounts as strings and evaluates back to an equal value."""
    slots = ResourceSlots({"cpu": "0.5", "mem": "1g"})
    assert repr(slots) == "ResourceSlots({'cpu': '0.5', 'mem': '1073741824'})"
    assert eval(repr(slots)) == slots


# --- pydantic --------------------------------------------------------------------------------


class _Model(BaseModel):
    resources: ResourceSlots


@pytest.mark.parametrize(
    "value",
    [
        {"cpu": 2, "mem": "4g"},
        {"cpu": "2", "mem": 4 * GIB},
        {"cpu": 2.0, "mem": "4GiB"},
        {"cpu": "2000m", "mem": 4 * GIB},
        {"cpu": Decimal(2), "mem": "4g"},
        "cpu=2,mem=4g",
        ResourceSlots({"cpu": 2, "mem": "4g"}),
    ],
)
def test_pydantic_accepts_mapping_or_string(value: object) -> None:
    """A pydantic field takes a dict of int/str/Decimal/float amounts or a slot string."""
    model = _Model.model_validate({"resources": value})
    assert model.resources == ResourceSlots({"cpu": 2, "mem": 4 * GIB})


def test_pydantic_reads_json_floats_as_their_decimal() -> None:
    """A JSON 0.1 becomes exactly Decimal('0.1'), not its binary approximation."""
    model = _Model.model_validate_json('{"resources": {"cpu": 0.1, "mem": "1g"}}')
    assert model.resources["cpu"] == Decimal("0.1")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"cpu": -1}, "slot 'cpu': must not be negative"),
        (
            {"cpu": True},
            "slot 'cpu': amount must be a number or a string like '4Gi' (got true/false)",
        ),
        (
            {"cpu": None},
            "slot 'cpu': amount must be a number or a string like '4Gi' (got NoneType)",
        ),
        ({"cpu": float("nan")}, "slot 'cpu': amount must be a finite number"),
        ({"mem": "4x"}, "slot 'mem': unknown unit 'x'"),
        ("cpu=2g", "slot 'cpu': unknown unit 'g'"),
        (5, "resources must be an object like"),
    ],
)
def test_pydantic_errors_carry_the_slot_message(value: object, fragment: str) -> None:
    """Pydantic validation errors carry the SlotError message, located at the field."""
    with pytest.raises(ValidationError) as caught:
        _Model.model_validate({"resources": value})
    [error] = caught.value.errors()
    assert error["loc"] == ("resources",)
    assert fragment in error["msg"]


def test_pydantic_serialises_to_json_dict() -> None:
    """A model dumps the field as the to_json() dict, which validates back to an equal value."""
    model = _Model(resources=ResourceSlots.parse("cpu=0.5,mem=1g"))
    assert model.model_dump() == {"resources": {"cpu": 0.5, "mem": 1073741824}}
    assert model.model_dump_json() == '{"resources":{"cpu":0.5,"mem":1073741824}}'
    assert _Model.model_validate_json(model.model_dump_json()) == model


def test_pydantic_json_schema_describes_both_forms() -> None:
    """Input: an object of numbers or quantity strings, or a slot string; output: numbers."""
    schema = _Model.model_json_schema()["properties"]["resources"]
    assert {option["type"] for option in schema["anyOf"]} == {"object", "string"}
    assert "Kubernetes quantity" in schema["description"]
    output = _Model.model_json_schema(mode="serialization")["properties"]["resources"]
    assert output["type"] == "object"
    assert output["additionalProperties"] == {"type": "number", "minimum": 0}
    assert "mem in bytes" in output["description"]


# --- properties ------------------------------------------------------------------------------

_COUNT_NAMES = ["cpu", "cuda.device", "cuda.shares", "tpu"]
_BYTE_NAMES = ["mem", "cuda.mem"]
_counts = st.decimals(min_value=0, max_value=MAX_FRACTIONAL_AMOUNT - 1, places=3)
_bytes = st.integers(min_value=0, max_value=int(MAX_AMOUNT))


@st.composite
def _slots(draw: st.DrawFn) -> ResourceSlots:
    counts = draw(st.dictionaries(st.sampled_from(_COUNT_NAMES), _counts))
    sizes = draw(st.dictionaries(st.sampled_from(_BYTE_NAMES), _bytes))
    return ResourceSlots({**counts, **sizes})


@given(_slots(), _slots())
def test_property_add_then_subtract_is_identity(a: ResourceSlots, b: ResourceSlots) -> None:
    """(a + b) - b == a for any slots."""
    assert (a + b) - b == a


@given(_slots(), _slots())
def test_property_fits_in_a_sum(a: ResourceSlots, b: ResourceSlots) -> None:
    """a always fits in a + b."""
    assert a.fits_in(a + b)


@given(_slots())
def test_property_human_format_parses_back(a: ResourceSlots) -> None:
    """parse(format_human()) gives back the same slots."""
    assert ResourceSlots.parse(a.format_human()) == a


@given(_slots())
def test_property_json_round_trip(a: ResourceSlots) -> None:
    """from_json(to_json()) gives back exactly the same slots, through JSON text too."""
    assert ResourceSlots.from_json(a.to_json()) == a
    assert ResourceSlots.from_json(json.loads(json.dumps(a.to_json()))) == a
    assert _Model.model_validate_json(_Model(resources=a).model_dump_json()).resources == a


@given(_slots())
def test_property_text_round_trip(a: ResourceSlots) -> None:
    """The text form reads back exactly, as amounts and as repr."""
    assert ResourceSlots(a.to_text()) == a
    assert eval(repr(a)) == a


_SIZE_UNITS = st.sampled_from(["", "k", "m", "g", "t", "Ki", "Mi", "Gi", "Ti", "M", "G", "T"])


@given(st.integers(min_value=0, max_value=10**6), _SIZE_UNITS)
def test_property_size_units_scale_exactly(number: int, unit: str) -> None:
    """`N<unit>` is N times the unit's size: binary for Ki.. and the old k/m/g/t, decimal for
    Kubernetes' M/G/T; a size within the bound parses, one above it names the bound."""
    size = {"": 1, "M": 10**6, "G": 10**9, "T": 10**12}.get(unit) or 1024 ** (
        "kmgt".index(unit[0].lower()) + 1
    )
    if number * size > MAX_AMOUNT:
        with pytest.raises(SlotError, match="more than corral handles"):
            parse_amount("mem", f"{number}{unit}")
    else:
        assert parse_amount("mem", f"{number}{unit}") == number * size


@given(st.integers(min_value=0, max_value=10**12))
def test_property_milli_suffix_is_a_thousandth(milli: int) -> None:
    """`Nm` cpu is N/1000 cores, and reads back from the JSON form as the same amount."""
    amount = parse_amount("cpu", f"{milli}m")
    assert amount * 1000 == milli
    assert ResourceSlots.from_json(ResourceSlots({"cpu": amount}).to_json()) == ResourceSlots(
        {"cpu": amount}
    )


@given(st.decimals(min_value=MAX_AMOUNT, max_value=MAX_AMOUNT * 10, places=0))
def test_property_amounts_above_the_bound_name_it(amount: Decimal) -> None:
    """Every amount above 10¹⁵ is refused with a message naming the slot and the bound."""
    if amount == MAX_AMOUNT:
        assert ResourceSlots({"cpu": amount})["cpu"] == MAX_AMOUNT
        return
    with pytest.raises(SlotError, match=r"slot 'cpu': .* at most 1P"):
        ResourceSlots({"cpu": amount})


@given(_slots(), _slots(), st.integers(min_value=0, max_value=256))
def test_property_never_negative(a: ResourceSlots, b: ResourceSlots, factor: int) -> None:
    """Sums, products and allowed differences never hold a negative or zero amount."""
    results = [a + b, a * factor]
    try:
        results.append(a - b)
    except SlotError:
        assert not b.fits_in(a)
    for result in results:
        assert all(amount > 0 for amount in result.values())


@given(
    st.integers(min_value=0, max_value=10**9),
    st.integers(min_value=0, max_value=10**12),
    st.integers(min_value=0, max_value=10**6),
)
def test_milli_round_trip(cpu: int, mem_bytes: int, gpus: int) -> None:
    """to_milli/from_milli round-trip exactly for every amount the store can hold."""
    milli = {"cpu": cpu, "mem": mem_bytes * 1000, "cuda.device": gpus}
    slots = ResourceSlots.from_milli(milli)
    assert slots.to_milli() == {k: v for k, v in milli.items() if v}


def test_to_milli_rejects_amounts_finer_than_a_thousandth() -> None:
    """An amount the store cannot hold exactly is an error naming the slot, not a rounding."""
    assert ResourceSlots.parse("cpu=0.125,mem=1k").to_milli() == {"cpu": 125, "mem": 1024000}
    with pytest.raises(SlotError, match=r"slot 'cpu'.*3 decimal places"):
        ResourceSlots.parse("cpu=0.0001").to_milli()
