"""The cyclic garbage collector, set for a process whose work is thousands of attempts (the CLI's).

What the load bench measured (bench/RESULTS.md item 26): at N=1000 the collector took 13 % of the
controller's CPU, and its full collections, 15-100 ms each with every other thread stopped, came
in the start and end bursts, where every millisecond lands on some job's way; five of them
collected 163 objects in all. Nearly everything the collector walks lives as long as its attempt
(actors, reactor tasks, their closures) or as long as the process (modules, classes).

The `actor-run` CLI calls `tune_gc()` once it has imported what it needs; an embedder that runs
batches of thousands may call it too. The Runner itself only raises the thresholds while it is
open (`hold`/`let_go`; `Runner(tune_gc=False)` opts out): at 3,000 attempts at once Python's
thresholds cost the controller a third of its CPU in collector passes, 15-18 full collections of
every tracked object with every thread stopped (bench/RESULTS.md item 46). It never freezes (the
host's objects are the host's) and leaves thresholds the host set itself, and Python's come back
when the last open Runner closes.
"""

from __future__ import annotations

import gc
import threading

# Python's own: (700, 10, 10). The young threshold: at 10,000 heartbeats parked on the 0.5 s clock of
# bench/load.py, each beat's reschedules alone make 20,000 tracked objects, so 10,000 meant two young
# passes per beat, each walking every parked wait (bench/RESULTS.md item 50)
THRESHOLDS = (50_000, 20, 20)
PYTHONS = (700, 10, 10)

_lock = threading.Lock()
_held = 0  # open Runners that asked
_raised = False  # this module set THRESHOLDS (the host's own were Python's)


def tune_gc(*, collect: bool = True) -> None:
    """Collect once (unless `collect` is False), move every object alive now out of the collector's
    sight for good (`gc.freeze`: what the imports made is never garbage), and collect the young
    generation every 50,000 net allocations of tracked objects instead of 700 (and the older ones
    half as often). Cycles are still collected: only less often, and without walking the process's
    own furniture. Without the collection, garbage that exists now is frozen with the rest and never
    freed: pass False only where there is none to speak of (the CLI's start: the full collection
    walked 20,000 objects for 10 ms of CPU and found none)."""
    if collect:
        gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)


def hold() -> None:
    """An open Runner's: raise the thresholds to THRESHOLDS if they are Python's (a host that set
    its own, or turned the collector off, keeps its choice). Undone by the last `let_go`."""
    global _held, _raised
    with _lock:
        _held += 1
        if _held == 1 and gc.get_threshold() == PYTHONS:
            gc.set_threshold(*THRESHOLDS)
            _raised = True


def let_go() -> None:
    """A Runner closed: when no open Runner holds them, Python's thresholds come back (unless the
    host changed them meanwhile: then they are its)."""
    global _held, _raised
    with _lock:
        _held = max(0, _held - 1)
        if _held == 0 and _raised:
            if gc.get_threshold() == THRESHOLDS:
                gc.set_threshold(*PYTHONS)
            _raised = False
