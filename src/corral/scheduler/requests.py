"""A session's resource request as vectors over a group's slot columns."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from corral.domain.record import record
from corral.domain.session import PendingSession
from corral.domain.slots import MAX_AMOUNT, MILLI
from corral.scheduler.types import Int64Array

# The most of one slot a session may ask for in all, in milli-units: what the spec allows, and
# what 64-bit arrays hold with room to add a session's kernels up (`SessionSpec._check_total`).
MAX_SESSION_MILLI = int(MAX_AMOUNT * MILLI)


class InvalidRequestError(ValueError):
    """A stored request placement cannot work with (an amount that is no whole number of
    milli-units within bounds, or a total past `MAX_SESSION_MILLI`): the session is isolated."""


@record
class Request:
    """What one session asks for, in milli-units over the group's slot columns."""

    per_kernel: Int64Array  # shape (kernels, slots): kernel i's request
    total: Int64Array  # shape (slots,): the sum over kernels
    unknown_slots: tuple[str, ...]  # requested slots no column exists for (> 0 amounts only)
    multi_node: bool

    @property
    def kernels(self) -> int:
        return int(self.per_kernel.shape[0])


class RequestCache:
    """`session_request` memoised per distinct request: a group's sessions repeat a few shapes.

    The cached arrays are shared between sessions; nothing may modify them.
    """

    def __init__(self, slot_index: Mapping[str, int]) -> None:
        self.slot_index = slot_index
        self._known: dict[tuple[object, ...], Request] = {}

    def get(self, session: PendingSession) -> Request:
        """The request of `session`, built once per distinct shape."""
        if not all(isinstance(slots, Mapping) for slots in session.kernel_slots):
            raise InvalidRequestError("a kernel's request is no mapping of slots to amounts")
        key = (session.cluster_mode, *(tuple(slots.items()) for slots in session.kernel_slots))
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = session_request(session, self.slot_index)
        return found


def session_request(session: PendingSession, slot_index: Mapping[str, int]) -> Request:
    """Build the request vectors of `session` for a pool with columns `slot_index`.

    Raises InvalidRequestError for a request no array can hold (see the class).
    """
    if len(session.kernel_slots) != session.cluster_size:
        raise InvalidRequestError(
            f"{len(session.kernel_slots)} kernel requests for a cluster of {session.cluster_size}"
        )
    per_kernel = np.zeros((session.cluster_size, len(slot_index)), dtype=np.int64)
    unknown: list[str] = []
    totals: dict[str, int] = {}
    for row, slots in enumerate(session.kernel_slots):
        for name, amount in slots.items():
            if type(amount) is not int or not 0 <= amount <= MAX_SESSION_MILLI:
                raise InvalidRequestError(
                    f"slot {name!r}: {amount!r} is not a whole number of milli-units "
                    f"from 0 to {MAX_SESSION_MILLI}"
                )
            totals[name] = total = totals.get(name, 0) + amount
            if total > MAX_SESSION_MILLI:
                raise InvalidRequestError(
                    f"slot {name!r}: {total} milli-units in all is more than one session may "
                    f"ask for ({MAX_SESSION_MILLI})"
                )
            if amount == 0:
                continue
            column = slot_index.get(name)
            if column is None:
                if name not in unknown:
                    unknown.append(name)
                continue
            per_kernel[row, column] = amount
    return Request(
        per_kernel=per_kernel,
        total=per_kernel.sum(axis=0),
        unknown_slots=tuple(sorted(unknown)),
        multi_node=session.cluster_mode == "multi-node",
    )


def format_milli(amounts: Mapping[str, int]) -> str:
    """`cpu=2 mem=4GiB` for milli-unit amounts (for messages)."""
    from corral.domain.slots import ResourceSlots

    return ResourceSlots.from_milli({k: v for k, v in amounts.items() if v}).format_human()
