"""Resource slots: named amounts of compute that a kernel asks for or an agent offers.

A slot is a name such as `cpu`, `mem` or `cuda.device` and a non-negative `Decimal` amount.
Amounts are decimals, never floats, so that `0.1 + 0.2` cpu is exactly `0.3` and a capacity
check never fails on binary rounding.
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
from typing import Any, NoReturn

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

# The store keeps amounts as integers in thousandths of a unit.
MILLI = Decimal(1000)


class SlotError(ValueError):
    """A resource slot name or amount is invalid; the message names the slot."""


_NAME_RE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_COUNT_RE = re.compile(rf"[+-]?{_NUMBER}")
_SIZE_RE = re.compile(rf"(?P<sign>[+-]?)(?P<number>{_NUMBER})(?P<unit>[A-Za-z]*)")
_ITEM_SEPARATOR_RE = re.compile(r"\s*,\s*|\s+")
_EQUALS_RE = re.compile(r"\s*=\s*")

# Binary (1024-based) unit powers, like Slurm's `--mem=4G`.
_UNIT_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_HUMAN_UNITS = (("PiB", 5), ("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1))
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
    bytes; a fractional byte amount rounds up. Size units are binary (1024-based), like Slurm's
    `--mem=4G`: `4g`, `4G`, `4gb`, `4Gi` and `4GiB` all mean 4 * 1024**3 bytes.
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
                raise SlotError(f"slot {name!r}: given more than once; give each slot once")
            amounts[name] = amount
        return cls(amounts)

    @classmethod
    def from_json(cls, data: Mapping[str, str | int]) -> ResourceSlots:
        """Rebuild slots from `to_json()` output."""
        return cls(data)

    def to_json(self) -> dict[str, str]:
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
                    f"slot {name!r}: {_decimal_text(amount)} is finer than corral keeps; "
                    "use at most 3 decimal places (e.g. 0.125)"
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
                    f"slot {name!r}: cannot take {_decimal_text(amount)} from "
                    f"{_decimal_text(have)}; the result would be negative"
                )
            remaining[name] = _EXACT.subtract(have, amount)
        return ResourceSlots._trusted(remaining)

    def __mul__(self, factor: int) -> ResourceSlots:
        if isinstance(factor, bool) or not isinstance(factor, int):
            return NotImplemented
        if factor < 0:
            raise SlotError(f"cannot multiply resources by {factor}; use an integer 0 or above")
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
        return f"ResourceSlots({self.to_json()!r})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("ResourceSlots is immutable; build a new one instead")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("ResourceSlots is immutable; build a new one instead")

    def __reduce__(self) -> tuple[type[ResourceSlots], tuple[dict[str, str]]]:
        # Copy and pickle through the constructor, since attributes cannot be set afterwards.
        return (ResourceSlots, (self.to_json(),))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source_type: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _from_pydantic_input,
            serialization=core_schema.plain_serializer_function_ser_schema(ResourceSlots.to_json),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [
                {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "integer", "number"]},
                },
                {"type": "string"},
            ],
            "examples": [{"cpu": "2", "mem": "4g"}, "cpu=2,mem=4g"],
        }


def is_byte_slot(name: str) -> bool:
    """True for slots measured in bytes: `mem` and any slot whose last dotted part is `mem`."""
    return name.rsplit(".", 1)[-1] == "mem"


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"slot names must be strings (got {name!r})")
    if _NAME_RE.fullmatch(name) is None:
        raise SlotError(
            f"slot {name!r}: invalid name; use lowercase letters, digits and '_', "
            f"in dotted parts like cuda.device"
        )


def _coerce(name: str, value: object) -> Decimal:
    if isinstance(value, float):
        raise TypeError(
            f"slot {name!r}: float amounts are not accepted (got {value!r}); "
            f"pass a Decimal, an int or a string like '0.5' to avoid binary rounding"
        )
    if isinstance(value, bool) or not isinstance(value, Decimal | int | str):
        raise TypeError(
            f"slot {name!r}: amount must be a Decimal, an int or a string "
            f"(got {type(value).__name__})"
        )
    if isinstance(value, str):
        return _amount_from_text(name, value)
    return Decimal(value)


def _normalise(name: str, amount: Decimal, *, shown: str | None) -> Decimal:
    if not amount.is_finite():
        raise SlotError(f"slot {name!r}: amount must be a finite number (got {amount})")
    if amount < 0:
        got = shown if shown is not None else _decimal_text(amount)
        raise SlotError(f"slot {name!r}: amount must not be negative (got {got})")
    if is_byte_slot(name):
        amount = amount.to_integral_value(rounding=ROUND_CEILING)
    return Decimal(_decimal_text(amount))


def _canonical(amounts: dict[str, Decimal]) -> dict[str, Decimal]:
    """Drop zero amounts and order the slots the same way every time."""
    ordered = sorted(amounts, key=lambda name: (_LEADING_SLOTS.get(name, 2), name))
    return {name: amounts[name] for name in ordered if amounts[name] != _ZERO}


def _parse_item(item: str) -> tuple[str, Decimal]:
    text = item.strip()
    if not text:
        raise SlotError("empty resource item; write name=amount items like cpu=2,mem=4g")
    raw_name, equals, amount_text = text.partition("=")
    name = raw_name.strip()
    if not equals:
        raise SlotError(f"slot {name!r}: missing '=' in {text!r}; write name=amount like cpu=2")
    if not name:
        raise SlotError(f"empty slot name in {text!r}; write name=amount like cpu=2")
    _check_name(name)
    if not amount_text.strip():
        raise SlotError(f"slot {name!r}: missing amount after '='; write {name}=<amount>")
    return name, _normalise(name, _amount_from_text(name, amount_text), shown=amount_text.strip())


def _amount_from_text(name: str, raw: str) -> Decimal:
    text = raw.strip()
    if not is_byte_slot(name):
        if _COUNT_RE.fullmatch(text) is None:
            raise SlotError(
                f"slot {name!r}: {text!r} is not a number; {name} takes a plain count like 2 or 0.5"
            )
        return Decimal(text)
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise SlotError(
            f"slot {name!r}: {text!r} is not a size; "
            f"{name} takes bytes like 4294967296 or a size like 4g or 1.5GiB"
        )
    power = _unit_power(name, match["unit"], text)
    amount = _EXACT.multiply(Decimal(match["number"]), Decimal(1024**power))
    return -amount if match["sign"] == "-" else amount


def _unit_power(name: str, unit: str, text: str) -> int:
    if not unit:
        return 0
    prefix = unit.lower()
    for suffix in ("ib", "i", "b"):
        if prefix.endswith(suffix) and len(prefix) > len(suffix):
            prefix = prefix[: -len(suffix)]
            break
    power = _UNIT_POWERS.get(prefix)
    if power is None:
        raise SlotError(f"slot {name!r}: unknown unit {unit!r} in {text!r} (use k, m, g, t or p)")
    return power


def _decimal_text(amount: Decimal) -> str:
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _human_amount(name: str, amount: Decimal) -> str:
    if not is_byte_slot(name):
        return _decimal_text(amount)
    size = int(amount)
    for suffix, power in _HUMAN_UNITS:
        if size % 1024**power == 0:
            return f"{size // 1024**power}{suffix}"
    return str(size)


def _brief_amount(name: str, amount: Decimal) -> str:
    exact = _human_amount(name, amount)
    if not is_byte_slot(name):
        return exact
    size = int(amount)
    for suffix, power in _HUMAN_UNITS:
        if size >= 1024**power:
            rounded = f"{size / 1024**power:.1f}".removesuffix(".0")
            # An exact form that is no longer than the rounded one says more: keep it.
            return exact if len(exact) <= len(rounded) + len(suffix) else f"{rounded}{suffix}"
    return exact


def _from_pydantic_input(value: object) -> ResourceSlots:
    if isinstance(value, ResourceSlots):
        return value
    if isinstance(value, str):
        return ResourceSlots.parse(value)
    if isinstance(value, Mapping):
        # JSON clients send 0.5 as a float; its shortest repr is the decimal they meant.
        amounts = {
            name: Decimal(repr(amount)) if isinstance(amount, float) else amount
            for name, amount in value.items()
        }
        try:
            return ResourceSlots(amounts)
        except TypeError as error:
            raise SlotError(str(error)) from error
    raise SlotError(
        "resources must be a mapping like {'cpu': 2, 'mem': '4g'} "
        f"or a string like 'cpu=2,mem=4g' (got {type(value).__name__})"
    )
