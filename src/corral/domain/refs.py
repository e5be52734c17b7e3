"""What users type to name a session or a job array, as the server and the CLI both read it.

A job array is named by its number (its first element's session number, as Slurm's array job
id is its first task's job id) and an element by `ARRAY_INDEX`: `12_7` is element 7 of array
12. The problem types the API answers a reference with are here too, so that the CLI tells a
reference to retype (a usage error) from any other failure by the same names the API sends.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from corral.domain.record import record

# Problem types (`type` slugs) of a reference that names no one session.
REF_AMBIGUOUS = "session-ambiguous"  # a name or id prefix that fits several sessions
REF_NAMES_ARRAY = "session-ref-is-array"  # a whole job array where one session is needed
ARRAY_NOT_FOUND = "array-not-found"

_NUMBER = r"[1-9][0-9]{0,17}"  # within a BIGINT, no leading zero
NUMBER = re.compile(_NUMBER)
_ELEMENT = re.compile(rf"({_NUMBER})_([0-9]{{1,10}})")


@record
class ElementRef:
    """`12_7`: element `index` of the array numbered `array_number`."""

    array_number: int
    index: int

    def __str__(self) -> str:
        return element_ref(self.array_number, self.index)


def element_ref(array_number: int, index: int) -> str:
    """How an array's element is written: `12_7`."""
    return f"{array_number}_{index}"


def session_ref(number: int, array_number: int | None, array_index: int | None) -> str:
    """What to type for a session: `12_7` for a job array's element, else its number."""
    if array_number is not None and array_index is not None:
        return element_ref(array_number, array_index)
    return str(number)


def parse_element_ref(text: str) -> ElementRef | None:
    """`text` as an array element's reference (`12_7`), if it is one."""
    match = _ELEMENT.fullmatch(text.strip())
    if match is None:
        return None
    return ElementRef(int(match[1]), int(match[2]))


def collapse_indexes(indexes: Iterable[int], throttle: int | None = None) -> str:
    """Indexes in squeue's compact form, ascending: `[0-3,7,9-10]`, with the array's throttle
    `[0-3,7%2]`; one index without a throttle is itself: `5`."""
    ordered = sorted(set(indexes))
    if len(ordered) == 1 and throttle is None:
        return str(ordered[0])
    runs: list[str] = []
    start = previous = ordered[0]
    for index in [*ordered[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    cap = "" if throttle is None else f"%{throttle}"
    return f"[{','.join(runs)}{cap}]"
