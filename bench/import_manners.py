"""What importing the Runner does to the host's own asyncio: 20,000 `await asyncio.sleep(0)` under
`asyncio.run`, timed before and after `from actor_run import Runner` in the same process (the
median of 5 runs each). Before the reactor's asyncio loop was its own (protocols/hosts/aio.py),
the import brought trio-asyncio, which patches asyncio process-wide: the host's `asyncio.run`
then ran on its loop.

Prints a line per phase, then as its last line one JSON object:
{"before_s": ..., "after_s": ..., "ratio": after / before, "loop_class": ...}.

    python bench/import_manners.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLEEPS = 20_000
RUNS = 5


async def sleeps() -> float:
    t = time.perf_counter()
    for _ in range(SLEEPS):
        await asyncio.sleep(0)
    return time.perf_counter() - t


def timed() -> float:
    return statistics.median(asyncio.run(sleeps()) for _ in range(RUNS))


def main() -> None:
    before = timed()
    print(f"before the import: {before:.3f} s for {SLEEPS} sleeps (median of {RUNS})")
    from actor_run import Runner

    assert Runner.__module__ == "actor_run.supervisors.api.runner"  # loaded, not only named
    after = timed()
    loop = asyncio.new_event_loop()
    loop_class = f"{type(loop).__module__}.{type(loop).__qualname__}"
    loop.close()
    print(f"after the import:  {after:.3f} s (asyncio's loop class now {loop_class})")
    print(json.dumps({"before_s": round(before, 4), "after_s": round(after, 4), "ratio": round(after / before, 2),
                      "loop_class": loop_class}))


if __name__ == "__main__":
    main()
