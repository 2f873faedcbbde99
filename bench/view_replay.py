"""The live view's cost, without the controller's noise: a load run's events, recorded once with
their times, played back into the view at their pace.

    python bench/view_replay.py [--attempts N] [--job-seconds S] [--dir /dev/shm] [--events FILE]

1. record (skipped when --events names a file that exists): N virtual jobs of S seconds through the
   real Runner, as bench/load.py's phase 1 runs them, with a subscriber that keeps every event and
   the time it came; written to FILE (one `t event-as-JSON` line each; default <dir>/view-events-N.txt).
2. baseline: the events appended at their pace (a thread of their own) to a deque that a second
   thread empties every FRAME_S and does nothing with: what touching each event on another thread
   costs at the least.
3. the view: the same, with the live view (supervisors/views/live.py) taking them as `actor-run run`
   does on a terminal, drawing into a pseudo-terminal of 50 x 200 (bench/load_harness.py's Screen).

Printed: the CPU time of the taking thread in 2 and 3, and the view's as a ratio over the baseline's
(both measured in this run: the machine's speed moves between runs). The view's share of a
controller's CPU is bench/load.py --view's figure; this one is for comparing versions of the view
(bench/RESULTS.md, the live view at N=10,000). Only loopback: the sim cloud is files in a folder.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from load_harness import Screen, make_jobs, open_runner, sim_settings

from actor_run.protocols.messages import Event, decode_event, encode
from actor_run.supervisors.views.rows import FRAME_S

SCALE = 10.0


def record(n: int, job_s: float, folder: Path, out: Path) -> None:
    kept: list[tuple[float, Event]] = []
    keep = kept.append
    with tempfile.TemporaryDirectory(dir=folder, prefix="view-replay-") as d:
        root = Path(d)
        jobs = make_jobs(n, SCALE, {"sim": sim_settings(n, job_s, SCALE, {}, root / "sim")})
        runner = open_runner(root, n, SCALE)
        t0 = time.time()
        runner.subscribe(lambda e: keep((time.time(), e)))
        try:
            for job in jobs:
                runner.submit(job)
            runner.wait(timeout=300 + 2 * job_s + 0.1 * n)
        finally:
            runner.close()
    with out.open("wb") as f:
        for t, e in kept:
            f.write(b"%.4f " % (t - t0) + encode(e) + b"\n")
    out.with_suffix(".keys").write_text("\n".join(j.key for j in jobs))


def load(path: Path) -> tuple[list[str], list[tuple[float, Event]]]:
    events = []
    with path.open("rb") as f:
        for line in f:
            t, _, body = line.partition(b" ")
            events.append((float(t), decode_event(body)))
    return path.with_suffix(".keys").read_text().split("\n"), events


def play(events: list[tuple[float, Event]], append: Callable[[Event], None]) -> None:
    """Each event appended at its time (looked at every 5 ms, as actor threads would have said them)."""
    t0 = time.time()
    i, n = 0, len(events)
    while i < n:
        now = time.time() - t0
        while i < n and events[i][0] <= now:
            append(events[i][1])
            i += 1
        time.sleep(0.005)


def baseline(events: list[tuple[float, Event]]) -> float:
    """CPU of a thread that empties the deque every FRAME_S and does nothing with what it takes."""
    q: collections.deque[Event] = collections.deque()
    over = threading.Event()
    cpu = [0.0]

    def drain() -> None:
        t = time.thread_time()
        take = q.popleft
        while not over.is_set() or q:
            time.sleep(FRAME_S)
            for _ in range(len(q)):
                e = take()
                type(e)
        cpu[0] = time.thread_time() - t

    thread = threading.Thread(target=drain, name="bench-drain")
    thread.start()
    play(events, q.append)
    over.set()
    thread.join(60)
    return cpu[0]


def view(keys: list[str], events: list[tuple[float, Event]]) -> tuple[float, int, int]:
    class _NoBudget:  # what Screen reads of a Runner: a budget whose statistics say none
        class budget:
            @staticmethod
            def statistics() -> None:
                return None

    screen = Screen(keys, _NoBudget)  # type: ignore[arg-type]
    screen.start()
    play(events, screen.events.append)
    screen.close(60)
    stats = screen.view.statistics()
    return screen.cpu_s, stats.events, stats.redraws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=10_000)
    ap.add_argument("--job-seconds", type=float, default=30.0)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--events", type=Path, default=None, help="the recording (made if it does not exist)")
    args = ap.parse_args()
    path = args.events or args.dir / f"view-events-{args.attempts}.txt"
    if not path.exists():
        print(f"recording {args.attempts} jobs of {args.job_seconds:.0f} s into {path}", flush=True)
        record(args.attempts, args.job_seconds, args.dir, path)
    keys, events = load(path)
    print(f"{len(events)} events over {events[-1][0]:.1f} s, {len(keys)} jobs", flush=True)
    base = baseline(events)
    cpu, taken, redraws = view(keys, events)
    print(f"baseline (taking each event, nothing else)  {base:.3f} s")
    print(f"the view ({taken} taken, {redraws} redraws)  {cpu:.3f} s")
    print(f"the view / baseline                        {cpu / max(base, 1e-9):.2f}")


if __name__ == "__main__":
    main()
