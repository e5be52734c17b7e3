"""Resource slots: named amounts of compute that a kernel asks for or an agent offers.

A slot is a name such as `cpu`, `mem` or `cuda.device` and a non-negative `Decimal` amount.
Amounts are decimals, never floats, so that `0.1 + 0.2` cpu is exactly `0.3` and a capacity
check never fails on binary rounding.

In JSON (the API, every `--json` output) slots are numbers in base units: cpu in cores
(`0.5`), mem in bytes as an integer, devices as counts. Text amounts are Kubernetes
quantities (`500m` = 0.5, `4G` = 4·10⁹, `4Gi` = 4·2³⁰); for byte slots the old lowercase
spellings keep their old binary meaning (`4g` = 4Gi, `512m` = 512Mi), as in Slurm's `--mem`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_CEILING,
    Context,
    Decimal,
    Inexact,
    InvalidOperation,
)
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # pydantic is imported only when it builds a model with slots in it
    from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import core_schema

# The store keeps amounts as integers in thousandths of a unit.
MILLI = Decimal(1000)
# The largest amount of one slot: 1P (a petabyte of memory), 10¹⁸ in the store's milli-units,
# which are 64-bit integers (at most 9.2·10¹⁸): anything larger is a typo, not a machine.
MAX_AMOUNT = Decimal(10**15)
# A fractional amount stays below this, so that it has at most 15 significant digits with its
# three decimals: what a JSON number (a double) carries exactly to every client.
MAX_FRACTIONAL_AMOUNT = Decimal(10**12)


class SlotError(ValueError):
    """A resource slot name or amount is invalid: `problem` says what, `slot` names the slot."""

    def __init__(self, slot: str | None, problem: str) -> None:
        super().__init__(f"slot {slot!r}: {problem}" if slot is not None else problem)
        self.slot = slot
        self.problem = problem


class SlotTypeError(SlotError, TypeError):
    """An amount of a type slots do not take (a float, a bool, None)."""


_NAME_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")
# A Kubernetes quantity: a signed decimal, then an exponent (`1e3`) or a unit suffix (`Gi`).
_QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:[eE](?P<exponent>[+-]?\d{1,2})|(?P<unit>[A-Za-z]+))?"
)
_ITEM_SEPARATOR_RE = re.compile(r"\s*,\s*|\s+")
_EQUALS_RE = re.compile(r"\s*=\s*")

_PREFIXES = "kMGTPE"  # kilo to exa; Kubernetes writes the binary ones Ki, Mi, Gi, Ti, Pi, Ei
_BINARY = {f"{p.upper()}i": Decimal(1024**power) for power, p in enumerate(_PREFIXES, 1)}
_DECIMAL = {p: Decimal(1000**power) for power, p in enumerate(_PREFIXES, 1)}
# Every slot: Kubernetes' suffixes, exactly as Kubernetes spells them (`500m` cpu is 0.5).
_COUNT_UNITS = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    **_DECIMAL,
    **_BINARY,
}
# corral's spellings before it followed Kubernetes, read case-insensitively: binary, as in
# Slurm's `--mem=4g`. A milli-byte means nothing, so `512m` of memory stays 512 MiB.
_LEGACY_BYTE_UNITS = {
    f"{p}{suffix}": Decimal(1024**power)
    for power, p in enumerate("kmgtp", 1)
    for suffix in ("", "b", "i", "ib")
}
# Byte slots: Kubernetes' and SI/IEC sizes (`4G` = `4GB` = 4·10⁹, `4Gi` = `4GiB` = 4·2³⁰),
# with the lowercase old spellings (`4g`, `512m`, `4k` = 4096) as they were.
_BYTE_UNITS = {
    "": Decimal(1),
    **{unit: size for unit, size in _DECIMAL.items() if unit != "k"},
    **{f"{unit}B": size for unit, size in _DECIMAL.items()},
    **_BINARY,
    **{f"{unit}B": size for unit, size in _BINARY.items()},
    **{unit: size for unit, size in _LEGACY_BYTE_UNITS.items() if unit.islower()},
}
_COUNT_FORMS = "a number like 2 or 0.5, or a Kubernetes quantity like 500m (= 0.5) or 2k"
_BYTE_FORMS = (
    "bytes like 4294967296, or a size like 4Gi or 4GiB (4·2³⁰), 4G or 4GB (4·10⁹), "
    "or the old 4g (= 4Gi) and 512m (= 512Mi)"
)
# Units a byte amount is shown in, largest first: the first that divides it exactly is used
# (binary before decimal of about the same size); `parse()` reads each back.
_HUMAN_UNITS = tuple(
    sorted(
        [(f"{unit}B", int(size)) for unit, size in (*_BINARY.items(), *_DECIMAL.items())],
        key=lambda unit_size: -unit_size[1],
    )
)
_BRIEF_UNITS = tuple((f"{unit}B", int(size)) for unit, size in reversed(_BINARY.items()))
# Well-known slots come first when listed; the rest follow by name.
_LEADING_SLOTS = {"cpu": 0, "mem": 1}
_ZERO = Decimal(0)
# Exact arithmetic: with these limits add, subtract and multiply never round, and the Inexact
# trap turns any rounding that still happened into an error instead of a silent wrong amount.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[InvalidOperation, Inexact])


class ResourceSlots(Mapping[str, Decimal]):
    """An immutable mapping of slot name to non-negative amount; a missing slot counts as zero.

    Zero amounts are dropped on construction, so `{"cpu": 1}` equals `{"cpu": 1, "mem": 0}`.
    Byte slots (`mem` and any slot whose last dotted part is `mem`, e.g. `cuda.mem`) hold whole
    bytes; a fractional byte amount rounds up. Text amounts are Kubernetes quantities (see the
    module's docstring): `4Gi`, `4GiB` and the old `4g` mean 4·2³⁰ bytes, `4G` and `4GB` 4·10⁹.
    """

    __slots__ = ("_amounts",)
    _amounts: dict[str, Decimal]

    def __init__(self, amounts: Mapping[str, Decimal | int | str] | None = None) -> None:
        checked: dict[str, Decimal] = {}
        for name, value in (amounts or {}).items():
            _check_name(name)
            checked[name] = _normalise(name, _coerce(name, value), shown=None)
        object.__setattr__(self, "_amounts", _canonical(checked))

    @classmethod
    def _trusted(cls, amounts: dict[str, Decimal]) -> ResourceSlots:
        """Wrap amounts already known to be valid (the results of slot arithmetic)."""
        slots = object.__new__(cls)
        object.__setattr__(slots, "_amounts", _canonical(amounts))
        return slots

    @classmethod
    def zero(cls) -> ResourceSlots:
        """No resources at all."""
        return cls()

    @classmethod
    def parse(cls, text: str) -> ResourceSlots:
        """Parse `name=amount` items separated by commas or whitespace, e.g. `cpu=2,mem=4g`."""
        joined = _EQUALS_RE.sub("=", text.strip())
        if not joined:
            return cls()
        return cls.parse_items(_ITEM_SEPARATOR_RE.split(joined))

    @classmethod
    def parse_items(cls, items: Iterable[str]) -> ResourceSlots:
        """Parse separate `name=amount` items, e.g. repeated CLI flags `["cpu=2", "mem=512m"]`."""
        amounts: dict[str, Decimal] = {}
        for item in items:
            name, amount = _parse_item(item)
            if name in amounts:
                raise SlotError(name, "given more than once; give each slot once")
            amounts[name] = amount
        return cls(amounts)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ResourceSlots:
        """Read slots in their JSON form (`to_json()`), or with quantity strings like `"4Gi"`."""
        return cls({name: _from_json_amount(amount) for name, amount in data.items()})

    def to_json(self) -> dict[str, int | float]:
        """The JSON form: numbers in base units, e.g. `{"cpu": 0.5, "mem": 4294967296}`.

        A whole amount is an int; a fractional one a float, which is exact because fractional
        amounts stay below `MAX_FRACTIONAL_AMOUNT` (and JSON readers read back the same decimal).
        """
        return {name: _json_number(amount) for name, amount in self._amounts.items()}

    def to_text(self) -> dict[str, str]:
        """Amounts as canonical decimal strings without exponent, e.g. `{"cpu": "0.5"}`."""
        return {name: _decimal_text(amount) for name, amount in self._amounts.items()}

    def to_milli(self) -> dict[str, int]:
        """Amounts in milli-units (1 cpu = 1000, 1 byte = 1000), as the store keeps them.

        Raises SlotError for an amount finer than a thousandth, which the store cannot hold.
        """
        milli: dict[str, int] = {}
        for name, amount in self._amounts.items():
            scaled = amount * MILLI
            if scaled != scaled.to_integral_value():
                raise SlotError(
                    name,
                    f"{_decimal_text(amount)} is finer than corral keeps; "
                    "use at most 3 decimal places (e.g. 0.125)",
                )
            milli[name] = int(scaled)
        return milli

    @classmethod
    def from_milli(cls, milli: Mapping[str, int]) -> ResourceSlots:
        """Rebuild slots from `to_milli()` output."""
        return cls({name: Decimal(amount) / MILLI for name, amount in milli.items()})

    def format_human(self) -> str:
        """A one-line summary such as `cpu=2 mem=4GiB cuda.device=1`; `parse()` reads it back."""
        return " ".join(
            f"{name}={_human_amount(name, amount)}" for name, amount in self._amounts.items()
        )

    def format_brief(self) -> str:
        """Like `format_human`, but a byte amount that no unit divides is rounded to a tenth of
        its largest unit (`mem=23.5GiB`, not `mem=24684084KiB`): for tables, not to parse."""
        return " ".join(
            f"{name}={_brief_amount(name, amount)}" for name, amount in self._amounts.items()
        )

    def names(self) -> frozenset[str]:
        """The names of the slots with a non-zero amount."""
        return frozenset(self._amounts)

    def is_zero(self) -> bool:
        """True when every slot is zero."""
        return not self._amounts

    def fits_in(self, capacity: ResourceSlots) -> bool:
        """True when every slot of this request is at most the same slot of `capacity`."""
        return all(
            amount <= capacity._amounts.get(name, _ZERO) for name, amount in self._amounts.items()
        )

    def __add__(self, other: ResourceSlots) -> ResourceSlots:
        if not isinstance(other, ResourceSlots):
            return NotImplemented
        total = dict(self._amounts)
        for name, amount in other._amounts.items():
            total[name] = _EXACT.add(total.get(name, _ZERO), amount)
        return ResourceSlots._trusted(total)

    def __sub__(self, other: ResourceSlots) -> ResourceSlots:
        if not isinstance(other, ResourceSlots):
            return NotImplemented
        remaining = dict(self._amounts)
        for name, amount in other._amounts.items():
            have = remaining.get(name, _ZERO)
            if amount > have:
                raise SlotError(
                    name,
                    f"cannot take {_decimal_text(amount)} from "
                    f"{_decimal_text(have)}; the result would be negative",
                )
            remaining[name] = _EXACT.subtract(have, amount)
        return ResourceSlots._trusted(remaining)

    def __mul__(self, factor: int) -> ResourceSlots:
        if isinstance(factor, bool) or not isinstance(factor, int):
            return NotImplemented
        if factor < 0:
            raise SlotError(
                None, f"cannot multiply resources by {factor}; use an integer 0 or above"
            )
        return ResourceSlots._trusted(
            {name: _EXACT.multiply(amount, factor) for name, amount in self._amounts.items()}
        )

    __rmul__ = __mul__

    def __getitem__(self, name: str) -> Decimal:
        return self._amounts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResourceSlots):
            return NotImplemented
        return self._amounts == other._amounts

    def __hash__(self) -> int:
        return hash(frozenset(self._amounts.items()))

    def __repr__(self) -> str:
        return f"ResourceSlots({self.to_text()!r})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("ResourceSlots is immutable; build a new one instead")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("ResourceSlots is immutable; build a new one instead")

    def __reduce__(self) -> tuple[type[ResourceSlots], tuple[dict[str, str]]]:
        # Copy and pickle through the constructor, since attributes cannot be set afterwards.
        return (ResourceSlots, (self.to_text(),))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source_type: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            _from_pydantic_input,
            serialization=core_schema.plain_serializer_function_ser_schema(ResourceSlots.to_json),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        if handler.mode == "serialization":
            return {
                "type": "object",
                "additionalProperties": {"type": "number", "minimum": 0},
                "description": _JSON_FORM,
                "examples": [{"cpu": 2, "mem": 4294967296, "cuda.device": 1}, {"cpu": 0.5}],
            }
        return {
            "anyOf": [
                {
                    "type": "object",
                    "additionalProperties": {"type": ["number", "string"]},
                },
                {"type": "string"},
            ],
            "description": f"{_JSON_FORM} {_TEXT_FORMS}",
            "examples": [
                {"cpu": 2, "mem": 4294967296},
                {"cpu": "500m", "mem": "4Gi"},
                "cpu=2,mem=4Gi",
            ],
        }


_JSON_FORM = (
    "Resource slots: numbers in base units, cpu in cores (0.5 is half a core), mem in bytes "
    "as an integer, devices (cuda.device) as counts."
)
_TEXT_FORMS = (
    "An amount may also be a Kubernetes quantity string: 500m (= 0.5), 2k, 4G (4·10⁹), "
    "4Gi (4·2³⁰); for byte slots also 4GB, 4GiB and the old lowercase 4g (= 4Gi) and "
    "512m (= 512Mi). The whole field may be a string like 'cpu=2,mem=4Gi'."
)


def is_byte_slot(name: str) -> bool:
    """True for slots measured in bytes: `mem` and any slot whose last dotted part is `mem`."""
    return name.rsplit(".", 1)[-1] == "mem"


def parse_amount(name: str, text: str) -> Decimal:
    """One slot's amount from text such as `0.5`, `500m` or `4Gi`, checked like any amount."""
    _check_name(name)
    return _normalise(name, _amount_from_text(name, text), shown=text.strip())


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"slot names must be strings (got {name!r})")
    if _NAME_RE.fullmatch(name) is None:
        raise SlotError(
            name,
            "invalid name; use lowercase letters, digits and '_', in dotted parts like cuda.device",
        )


def _coerce(name: str, value: object) -> Decimal:
    if isinstance(value, float):
        raise SlotTypeError(
            name,
            f"float amounts are not accepted (got {value!r}); pass a Decimal, an int or a "
            "string like '0.5' to avoid binary rounding",
        )
    if isinstance(value, bool) or not isinstance(value, Decimal | int | str):
        raise SlotTypeError(
            name, f"amount must be a number or a string like '4Gi' (got {_kind(value)})"
        )
    if isinstance(value, str):
        return _amount_from_text(name, value)
    return Decimal(value)


def _from_json_amount(value: object) -> Any:
    # JSON numbers with a fraction arrive as floats: their shortest repr is the decimal meant.
    # Anything else goes to the constructor as it is, which says what it does not take.
    if isinstance(value, float):
        return Decimal(repr(value))
    return value


def _json_number(amount: Decimal) -> int | float:
    whole = int(amount)
    return whole if whole == amount else float(amount)


def _kind(value: object) -> str:
    return "true/false" if isinstance(value, bool) else type(value).__name__


def _normalise(name: str, amount: Decimal, *, shown: str | None) -> Decimal:
    got = shown if shown is not None else None
    if not amount.is_finite():
        raise SlotError(name, f"amount must be a finite number (got {got or amount})")
    if amount < 0:
        raise SlotError(name, f"must not be negative (got {got or _decimal_text(amount)})")
    if amount > MAX_AMOUNT:
        raise SlotError(
            name, f"{got or _decimal_text(amount)} is more than corral handles; at most 1P (10¹⁵)"
        )
    if is_byte_slot(name):
        amount = amount.to_integral_value(rounding=ROUND_CEILING)
    elif amount >= MAX_FRACTIONAL_AMOUNT and amount != amount.to_integral_value():
        raise SlotError(
            name,
            f"{got or _decimal_text(amount)} has a fraction and is too large; "
            "an amount with a fraction must be below 10¹²",
        )
    return Decimal(_decimal_text(amount))


def _canonical(amounts: dict[str, Decimal]) -> dict[str, Decimal]:
    """Drop zero amounts and order the slots the same way every time."""
    ordered = sorted(amounts, key=lambda name: (_LEADING_SLOTS.get(name, 2), name))
    return {name: amounts[name] for name in ordered if amounts[name] != _ZERO}


def _parse_item(item: str) -> tuple[str, Decimal]:
    text = item.strip()
    if not text:
        raise SlotError(None, "empty resource item; write name=amount items like cpu=2,mem=4Gi")
    raw_name, equals, amount_text = text.partition("=")
    name = raw_name.strip()
    if not equals:
        raise SlotError(name, f"missing '=' in {text!r}; write name=amount like cpu=2")
    if not name:
        raise SlotError(None, f"empty slot name in {text!r}; write name=amount like cpu=2")
    if not amount_text.strip():
        _check_name(name)
        raise SlotError(name, f"missing amount after '='; write {name}=<amount>")
    return name, parse_amount(name, amount_text)


def _amount_from_text(name: str, raw: str) -> Decimal:
    text = raw.strip()
    byte_slot = is_byte_slot(name)
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        what = "a size" if byte_slot else "a quantity"
        raise SlotError(name, f"{text!r} is not {what}; {name} takes {_forms(byte_slot)}")
    number = Decimal(match["number"])
    if match.lastindex == 1:  # a plain number, the common case: nothing to scale
        return number
    if match["exponent"] is not None:
        return number.scaleb(int(match["exponent"]), _EXACT)
    unit = match["unit"] or ""
    scale = _unit_scale(unit, byte_slot)
    if scale is None:
        raise SlotError(
            name, f"unknown unit {unit!r} in {text!r}; {name} takes {_forms(byte_slot)}"
        )
    return _EXACT.multiply(number, scale)


def _unit_scale(unit: str, byte_slot: bool) -> Decimal | None:
    if not byte_slot:
        return _COUNT_UNITS.get(unit)
    scale = _BYTE_UNITS.get(unit)
    if scale is None:
        # Other spellings of the old units (`4G`'s cousins `4Gb`, `4K`, `4GIB`) keep their
        # old binary meaning; only Kubernetes' own spellings changed.
        scale = _LEGACY_BYTE_UNITS.get(unit.lower())
    return scale


def _forms(byte_slot: bool) -> str:
    return _BYTE_FORMS if byte_slot else _COUNT_FORMS


def _decimal_text(amount: Decimal) -> str:
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _human_amount(name: str, amount: Decimal) -> str:
    if not is_byte_slot(name):
        return _decimal_text(amount)
    size = int(amount)
    for suffix, unit in _HUMAN_UNITS:
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _brief_amount(name: str, amount: Decimal) -> str:
    exact = _human_amount(name, amount)
    if not is_byte_slot(name):
        return exact
    size = int(amount)
    for suffix, unit in _BRIEF_UNITS:
        if size >= unit:
            rounded = f"{size / unit:.1f}".removesuffix(".0")
            # An exact form that is no longer than the rounded one says more: keep it.
            return exact if len(exact) <= len(rounded) + len(suffix) else f"{rounded}{suffix}"
    return exact


def _from_pydantic_input(value: object) -> ResourceSlots:
    if isinstance(value, ResourceSlots):
        return value
    if isinstance(value, str):
        return ResourceSlots.parse(value)
    if isinstance(value, Mapping):
        return ResourceSlots.from_json(value)
    raise SlotError(
        None,
        "resources must be an object like {'cpu': 2, 'mem': 4294967296} "
        f"or a string like 'cpu=2,mem=4Gi' (got {_kind(value)})",
    )
