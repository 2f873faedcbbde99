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

Tests that share a costly per-process session fixture are dealt as units, so that a few workers pay
its start instead of each one that happens to get one of its tests (`GROUPS`: moto's server imports
EC2's models for about 3 s of CPU; its 25 tests, three minutes, go to two shares; `TOGETHER`:
SkyPilot's own interpreter, about 4 s, for seven tests, and the fake RunPod serverless's zygote, about
1.5 s with the py-cpuinfo subprocess RunPod's SDK runs at import, for about forty, all go into one of
those two, whether they use moto or not: six workers had each started a zygote, two SkyPilot's).

Refresh the file from a run: `sh scripts/test.sh --durations=0 | python tests/support/schedule.py`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TypeVar

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"  # tests/durations.json
LONG_S = 4.0
GROUPS = {"moto": 2}  # a session fixture -> how many shares its tests are dealt to
# a session fixture whose tests all go into one part of a group
TOGETHER = {"sky_own": "moto", "runpod_zygote": "moto"}

T = TypeVar("T")


def share_sizes(count: int, workers: int) -> list[int]:
    """How many of `count` tests each of `workers` gets at the start (xdist's WorkStealingScheduling)."""
    sizes, left = [], count
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def groups(fixtures: list[set[str]], names: list[str], durations: dict[str, float]) -> dict[int, str]:
    """Each test's group (index -> `fixture/part`) by the fixtures it asks for: a GROUPS fixture's
    tests split into that many parts of about even length, the TOGETHER ones all in its first part."""
    out: dict[int, str] = {}
    for fixture, parts in GROUPS.items():
        together = {t for t, g in TOGETHER.items() if g == fixture}
        # a TOGETHER fixture's tests are the group's whether they ask for its fixture or not
        members = [i for i, f in enumerate(fixtures) if (fixture in f or together & f) and i not in out]
        load = [0.0] * parts
        for i in sorted(members, key=lambda i: (not together & fixtures[i], -durations.get(names[i], 0.0), i)):
            p = 0 if together & fixtures[i] else min(range(parts), key=lambda p: (load[p], p))
            out[i] = f"{fixture}/{p}"
            load[p] += durations.get(names[i], 0.0)
    return out


def order(items: list[T], names: list[str], durations: dict[str, float], workers: int,
          groups: dict[int, str] | None = None) -> list[T]:
    """`items` (named by `names`, in order) rearranged so that each worker's share starts with an
    even part of the long tests, longest first; the items of one group (`groups`: index -> its
    group) are dealt together, into one share."""
    if workers < 2 or len(items) < workers:
        return items
    time = [durations.get(n, 0.0) for n in names]
    by_group: dict[str, list[int]] = {}
    for i, g in sorted((groups or {}).items()):
        by_group.setdefault(g, []).append(i)
    # the groups first (each has a share's room then), then the long tests, longest first
    units = [sorted(members, key=lambda i: (-time[i], i)) for members in by_group.values()]
    units += sorted(([i] for i, t in enumerate(time) if t >= LONG_S and i not in (groups or {})),
                    key=lambda u: (-time[u[0]], u[0]))
    sizes = share_sizes(len(items), workers)
    loads = [0.0] * workers
    heads: list[list[int]] = [[] for _ in range(workers)]
    while units:
        unit = units.pop(0)
        # the share with the least long work that still has room for the whole unit (a group larger
        # than any share's room is dealt as single tests)
        room = [w for w in range(workers) if len(heads[w]) + len(unit) <= sizes[w]]
        if not room:
            units[:0] = [[i] for i in unit]
            continue
        w = min(room, key=lambda w: (loads[w], w))
        heads[w] += unit
        loads[w] += sum(time[i] for i in unit)
    taken = {i for head in heads for i in head}
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
