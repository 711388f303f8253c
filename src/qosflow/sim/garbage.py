"""How often the interpreter's cyclic garbage collector runs while a simulation goes on.

A run makes millions of short-lived objects (snapshots, beliefs' views, candidates, placements),
nearly all of them freed by reference counting the moment they are dropped. At the interpreter's
default the collector still ran every 700 net allocations and took 8 s of cluster04's two
minutes (docs/experiments.md, 2026-12-07 (eighth)); the objects it would find are few, so it
runs less often while the engine runs, and as before once it returns.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_COLLECTION_AT = 100_000
"""Net allocations between two collections of the youngest generation during a run."""


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Collect the youngest generation every :data:`YOUNG_COLLECTION_AT` allocations.

    The older generations keep their own thresholds (relative to the youngest), a collector
    switched off stays off, and the thresholds come back as they were when the block ends.
    """
    before = gc.get_threshold()
    if before[0]:
        gc.set_threshold(max(before[0], YOUNG_COLLECTION_AT), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
