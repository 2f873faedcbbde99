"""Census of the objects the cyclic collector tracks, per running job, through the real Runner on
the `sim` cloud with virtual machines (bench/load.py's harness and settings).

    python bench/census.py --attempts N [--scale F] [--top K] [--json]

1. a Runner is opened, `gc.collect()`, and every tracked object is counted by type (the baseline);
2. N jobs of 600 s are submitted; once every one said `JobStarted` and a few policy polls went by
   (the steady state), `gc.collect()` and the count again: (steady - baseline) / N is what each
   running job holds, by type; and how long a full collection takes then (median of 3);
3. the collector is switched off, `runner.cancel()`, and once every job ended the count again
   without a collection: (after - steady) / N is what the cancel left for the collector per job
   (objects freed by their reference count are not in it: only what is still alive or waits for a
   collection), `gc.get_count()` says how many tracked objects were allocated net.

The collector's full collection walks every tracked object with every thread stopped: the
tracked objects per running job are what makes it cost seconds at N=10,000 (bench/RESULTS.md,
issue 30). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from load_figures import Tally
from load_harness import PRODUCTION_POLICY, make_jobs, open_runner, sim_settings
from loguru import logger


def census() -> Counter[str]:
    out: Counter[str] = Counter()
    for o in gc.get_objects():
        t = type(o)
        out[f"{t.__module__}.{t.__qualname__}"] += 1
    return out


def run(n: int, scale: float, settle_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="actor-run-census-", dir="/dev/shm") as tmp:
        root = Path(tmp)
        jobs = make_jobs(n, scale, {"sim": sim_settings(n, 600.0, scale, {}, root / "sim")})
        runner = open_runner(root, n, scale)
        try:
            tally = Tally()
            tally.expect = n
            runner.subscribe(tally)
            gc.collect()
            base = census()
            for job in jobs:
                runner.submit(job)
            if not tally.all_started.wait(120 + 0.1 * n):
                raise SystemExit("not every job started")
            time.sleep(settle_s)  # a few polls: the steady state's objects, not the start's
            gc.collect()
            full_s = []
            for _ in range(3):  # what one full collection costs now (every thread stopped meanwhile)
                t = time.perf_counter()
                gc.collect()
                full_s.append(time.perf_counter() - t)
            steady = census()
            gc.disable()
            count0 = sum(gc.get_count())
            t = time.perf_counter()
            runner.cancel()
            runner.wait(timeout=runner.delete_timeout_s + 180)
            cancel_s = time.perf_counter() - t
            allocated = sum(gc.get_count()) - count0
            after = census()
            gc.enable()
        finally:
            runner.close()
    per_job = {k: (steady[k] - base[k]) / n for k in steady if steady[k] - base[k] > 0}
    cancel = {k: (after[k] - steady[k]) / n for k in after if after[k] - steady[k] > 0}
    return {
        "attempts": n, "tracked_per_job": (sum(steady.values()) - sum(base.values())) / n,
        "by_type": dict(sorted(per_job.items(), key=lambda kv: -kv[1])),
        "cancel_left_per_job": (sum(after.values()) - sum(steady.values())) / n,
        "cancel_by_type": dict(sorted(cancel.items(), key=lambda kv: -kv[1])),
        "cancel_allocated_net_per_job": allocated / n, "cancel_s": cancel_s,
        "tracked_total": sum(steady.values()), "full_collection_s": sorted(full_s)[1],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=1000)
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=None, help="seconds of steady state (default: 3 polls)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logger.remove()
    settle = args.settle if args.settle is not None else 3 * PRODUCTION_POLICY["poll_s"] / args.scale
    r = run(args.attempts, args.scale, settle)
    if not args.json:
        print(f"tracked objects per running job: {r['tracked_per_job']:.1f} ({r['tracked_total']} in all; "
              f"a full collection {r['full_collection_s'] * 1000:.0f} ms)")
        for k, v in list(r["by_type"].items())[: args.top]:
            print(f"  {v:7.2f}  {k}")
        print(f"left by the cancel per job (collector off): {r['cancel_left_per_job']:.1f} "
              f"(net tracked allocations {r['cancel_allocated_net_per_job']:.1f}; cancel {r['cancel_s']:.2f} s)")
        for k, v in list(r["cancel_by_type"].items())[: args.top]:
            print(f"  {v:7.2f}  {k}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
