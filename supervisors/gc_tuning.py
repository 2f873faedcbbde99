"""The cyclic garbage collector, set for a process whose work is thousands of attempts (the CLI's).

What the load bench measured (bench/RESULTS.md item 26): at N=1000 the collector took 13 % of the
controller's CPU, and its full collections, 15-100 ms each with every other thread stopped, came
in the start and end bursts, where every millisecond lands on some job's way; five of them
collected 163 objects in all. Nearly everything the collector walks lives as long as its attempt
(actors, reactor tasks, their closures) or as long as the process (modules, classes).

A library must not change a process-wide setting under its embedder, so the Runner leaves the
collector alone. The `actor-run` CLI calls `tune_gc()` once it has imported what it needs; an
embedder that runs batches of thousands may call it too.
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 20, 20)  # Python's own: (700, 10, 10)


def tune_gc(*, collect: bool = True) -> None:
    """Collect once (unless `collect` is False), move every object alive now out of the collector's
    sight for good (`gc.freeze`: what the imports made is never garbage), and collect the young
    generation every 10,000 net allocations of tracked objects instead of 700 (and the older ones
    half as often). Cycles are still collected: only less often, and without walking the process's
    own furniture. Without the collection, garbage that exists now is frozen with the rest and never
    freed: pass False only where there is none to speak of (the CLI's start: the full collection
    walked 20,000 objects for 10 ms of CPU and found none)."""
    if collect:
        gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
