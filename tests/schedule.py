"""The order the suite runs in under pytest-xdist's `worksteal`: its long tests first, spread over
the workers.

`worksteal` cuts the collected list into one contiguous share per worker (the first share
`len // workers` items, each next one a fair part of what is left), each worker runs its share in
order, and a worker that runs out takes the back half of the fullest share. A test of half a
minute that happens to sit at the end of a share is the last thing the run waits for: on 2 cores
with six workers that tail was 18 s of a 4.5-minute run. So the long tests (tests/durations.json:
a test's typical seconds on a quiet machine, those of 4 s and more) are dealt out first, the
longest to the share with the least long work so far, and each share starts with its own; every
other test keeps its place relative to the rest. A test missing from the file counts as short, a
name in the file no test has is ignored: the file only moves tests, it never picks or drops one.

Refresh the file from a run: `sh scripts/test.sh --durations=0 | python tests/schedule.py`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TypeVar

DURATIONS = Path(__file__).with_name("durations.json")
LONG_S = 4.0

T = TypeVar("T")


def share_sizes(count: int, workers: int) -> list[int]:
    """How many of `count` tests each of `workers` gets at the start (xdist's WorkStealingScheduling)."""
    sizes, left = [], count
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def order(items: list[T], names: list[str], durations: dict[str, float], workers: int) -> list[T]:
    """`items` (named by `names`, in order) rearranged so that each worker's share starts with an
    even part of the long tests, longest first."""
    if workers < 2 or len(items) < workers:
        return items
    long = sorted((i for i, n in enumerate(names) if durations.get(n, 0.0) >= LONG_S),
                  key=lambda i: (-durations[names[i]], i))
    sizes = share_sizes(len(items), workers)
    loads = [0.0] * workers
    heads: list[list[int]] = [[] for _ in range(workers)]
    for i in long:
        # the share with the least long work that still has room for one more
        w = min((w for w in range(workers) if len(heads[w]) < sizes[w]), key=lambda w: (loads[w], w))
        heads[w].append(i)
        loads[w] += durations[names[i]]
    taken = set(long)
    rest = iter(i for i in range(len(items)) if i not in taken)
    out: list[T] = []
    for w in range(workers):
        out += [items[i] for i in heads[w]]
        out += [items[next(rest)] for _ in range(sizes[w] - len(heads[w]))]
    return out


def load() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def main() -> None:
    """Read pytest's `--durations=0` lines on stdin; write the tests of LONG_S and more to the file."""
    found: dict[str, float] = {}
    for line in sys.stdin:
        m = re.match(r"\s*([\d.]+)s call\s+(\S+)", line)
        if m and float(m.group(1)) >= LONG_S:
            found[m.group(2)] = round(float(m.group(1)), 1)
    DURATIONS.write_text(json.dumps(dict(sorted(found.items(), key=lambda kv: -kv[1])), indent=0) + "\n")
    print(f"{len(found)} tests of {LONG_S:g} s or more written to {DURATIONS}")


if __name__ == "__main__":
    main()
