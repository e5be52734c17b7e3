"""Garbage-collector settings for corral's processes.

CPython starts a collection every 700 net allocations and, every hundred of those, walks every
object the process holds. A manager holds hundreds of thousands of long-lived objects (modules,
SQLAlchemy's compiled statements, caches) and allocates in bursts of tens of thousands (a batch
of 10,000 rows): with the defaults, full collections of 40 to 65 ms landed in the middle of
batches. Objects alive at start-up are moved out of the collector's sight, and collections run
less often; reference counting still frees all non-cyclic garbage at once.

How often is a trade of the collector's total work against the length of one pause. A young
collection walks the objects allocated since the last one that are still alive; an older one
walks, besides, every survivor of the young ones since. Under load nearly everything alive is
work in flight (a kernel's worker, its messages, its rows): collected every 50,000 allocations,
most of it was walked twice or three times before it finished, and the collector took 12 % of
a `corral simulate` run (2.9 of 24 s, 20,000 sessions; 6.7 of 60 s at 40,000). Every 200,000,
most of it is freed before a collection finds it: 0.85 s of 24 (2.4 of 50 at 40,000); later,
with less allocated per session, 5 collections of 64 ms on average in an 11 s run. Every
500,000: one collection of 83 ms in that run (benchmarks.md, session 19). A pause is bounded
by what is in flight, whatever the setting (the longest seen, 0.3-0.5 s, were older
collections walking it all), and cycles are rare (about 7,900 objects in a 20,000-session
run), so collecting seldom costs little memory.
"""

from __future__ import annotations

import gc

# Young collections every 500,000 net allocations, older ones 10 and 100 times less often.
THRESHOLDS = (500_000, 10, 10)


def tune_gc(*, collect: bool = True) -> None:
    """Freeze what exists now and collect less often; call once, early, in a long-lived process.

    `collect=False` skips the full collection before the freeze: a command line just started
    has little garbage to free, and walking every object it imported costs it ~30 ms.
    """
    if collect:
        gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
