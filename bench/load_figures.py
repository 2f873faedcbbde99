"""bench/load.py's figures: what a load run measures and how (samplers of CPU, memory and threads,
the tally of events, the ideal wall time, message counts, leaks). load.py says what they mean."""

from __future__ import annotations

import gc
import itertools
import math
import os
import shutil
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import psutil
import pykka

from actor_run.actors.pool import live_actors
from actor_run.protocols.clouds.sim import Billing, billing, sim_machines
from actor_run.protocols.messages import AttemptStarted, Event, Exited, JobEnded, JobStarted, Leased, Progress, Retrying
from actor_run.supervisors.api.runner import Runner

_bill_decoder = msgspec.json.Decoder(Billing)

MIB = 1 << 20
# the lifecycle events the step table times, in their order in an attempt
STEP_KINDS = ("LeaseRequested", "Leased", "Uploaded", "JobStarted", "Exited", "Fetched", "Released",
              "AttemptEnded")


def file_create_us(folder: Path, n: int = 300) -> float:
    """What this folder's file system charges to create a file (microseconds, median of `n`): the
    controller makes a few files per attempt (its outputs, log and response; the sim's machine
    records), and on some disks a create costs a hundred times what it costs on others (an ext4
    without a journal skips every inode deleted in the last hours: 0.5 ms a create on this VM's
    /tmp after a day of test runs, 4 us on tmpfs). The figure says which disk a run measured."""
    probe = folder / "create-probe"
    probe.mkdir()
    times = []
    try:
        for i in range(n):
            t = time.perf_counter()
            os.close(os.open(probe / f"f{i}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
            times.append(time.perf_counter() - t)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return percentile(times, 50) * 1e6


def python_probe_ms(rounds: int = 7) -> float:
    """How fast this machine runs Python right now (milliseconds, median of `rounds` runs of a fixed
    loop of dict, list, attribute and small-object work, like the controller's). The VM shares its
    host: the same code measured 5.4 ms of CPU per attempt one hour and 7.5 ms the next, and
    wall/ideal moves with it (the bursts are bound by CPU). Compare runs at a similar probe."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        d: dict[int, list[int]] = {}
        for i in range(60_000):
            d.setdefault(i & 1023, []).append(i)
            if len(d[i & 1023]) > 8:
                d[i & 1023] = [sum(d[i & 1023])]
        times.append(time.perf_counter() - t)
    return percentile(times, 50) * 1e3


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


class Sampler:
    """Samples this process's RSS and thread count every `period_s` in a daemon thread."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self.proc = psutil.Process()
        self.peak_rss = 0
        self.peak_threads = 0
        self.cpu: list[tuple[float, float, float]] = []  # (wall clock, process CPU, its kernel part) per sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        self.peak_threads = max(self.peak_threads, threading.active_count())
        self.cpu.append((time.time(), time.process_time(), os.times().system))

    def cpu_between(self, t0: float, t1: float) -> float:
        """Process CPU seconds between two wall-clock times (to the nearest samples)."""
        inside = [c for t, c, _ in self.cpu if t0 <= t <= t1]
        return inside[-1] - inside[0] if len(inside) > 1 else 0.0

    def sys_between(self, t0: float, t1: float) -> float:
        """The kernel's part of `cpu_between` (system calls, thread wake-ups, page faults)."""
        inside = [k for t, _, k in self.cpu if t0 <= t <= t1]
        return inside[-1] - inside[0] if len(inside) > 1 else 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


class Collections:
    """While entered, the cyclic collector's passes (`gc.callbacks`): how many full (generation 2)
    ones and the seconds they and all passes took (every thread of the process stopped meanwhile),
    and per generation the passes, their seconds and the objects they collected."""

    def __init__(self) -> None:
        self.full = 0
        self.full_s = 0.0
        self.all_s = 0.0
        self.by_generation = [[0, 0.0, 0] for _ in range(3)]  # per generation: passes, seconds, objects collected
        self.passes: list[tuple[float, float]] = []  # each pass: when it ended (time.time()), its seconds
        self._t = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        dt = time.perf_counter() - self._t
        self.all_s += dt
        self.passes.append((time.time(), dt))
        gen = self.by_generation[info["generation"]]
        gen[0] += 1
        gen[1] += dt
        gen[2] += info["collected"]
        if info["generation"] == 2:
            self.full += 1
            self.full_s += dt

    def between(self, t0: float, t1: float) -> tuple[int, float]:
        """The passes that ended between `t0` and `t1` (time.time()): how many, and their seconds."""
        inside = [dt for t, dt in self.passes if t0 <= t <= t1]
        return len(inside), sum(inside)

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class Tally:
    """A Runner subscriber: counts events and keeps what the ideal needs. Runs on actor threads,
    so it only updates counters under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events = 0
        self.kinds: Counter[str] = Counter()
        self.attempts: dict[tuple[str, int], list[int]] = {}
        self.machine: dict[tuple[str, int, int], str] = {}
        self.exited: set[tuple[str, int, int]] = set()
        self.backoff: defaultdict[tuple[str, int], float] = defaultdict(float)
        self.ended: dict[tuple[str, int], JobEnded] = {}
        self.started_jobs: set[tuple[str, int]] = set()
        self.all_started = threading.Event()
        self.expect = 0
        self.marks: dict[str, list[float]] = {}  # per lifecycle kind, the time each attempt said it
        self.steps: defaultdict[str, list[float]] = defaultdict(list)  # "A -> B": per attempt, seconds
        self._last: dict[tuple[str, int, int], tuple[str, float]] = {}
        self._progress = itertools.count()
        self._reads = 0

    def progress_lines(self) -> int:
        """The Progress events counted so far (a read takes a number of the count too: subtracted)."""
        self._reads += 1
        return next(self._progress) - (self._reads - 1)

    def counts(self) -> tuple[int, dict[str, int]]:
        """Every event counted so far, and per kind (the caller holds the lock)."""
        n = self.progress_lines()
        kinds = dict(self.kinds)
        if n:
            kinds["Progress"] = n
        return self.events + n, kinds

    def __call__(self, e: Event) -> None:
        if type(e) is Progress:
            # one per poll per job (6 million at N=10,000): counted by a C call, no lock (`next` on a
            # count is one step under the GIL, whatever thread calls it); the lock and two counters it
            # took were 6 % of the pool thread in an end burst's profile: the bench's own cost
            next(self._progress)
            return
        with self.lock:
            self.events += 1
            kind = type(e).__name__
            self.kinds[kind] += 1
            if kind in STEP_KINDS:
                self.marks.setdefault(kind, []).append(e.t)
                key = (e.job, e.seed, getattr(e, "attempt", 0))
                last = self._last.get(key)
                if last is not None:
                    self.steps[f"{last[0]} -> {kind}"].append(e.t - last[1])
                self._last[key] = (kind, e.t)
            job = (e.job, e.seed)
            match e:
                case AttemptStarted():
                    self.attempts.setdefault(job, []).append(e.attempt)
                case Leased(machine=m):
                    self.machine[(e.job, e.seed, e.attempt)] = m.name
                case Exited():
                    self.exited.add((e.job, e.seed, e.attempt))
                case Retrying(delay_s=d):
                    self.backoff[job] += d
                case JobStarted():
                    self.started_jobs.add(job)
                    if self.expect and len(self.started_jobs) >= self.expect:
                        self.all_started.set()
                case JobEnded():
                    self.ended[job] = e
                case _:
                    pass


def ideal_per_job(tally: Tally, sim_dir: Path, job_s: float, launch_s: float,
                  delete_s: float) -> dict[tuple[str, int], float]:
    """Each job's critical path with zero controller overhead (see the module docstring)."""
    bills = {b.name: b for b in billing(sim_dir)}
    out: dict[tuple[str, int], float] = {}
    for job, attempts in tally.attempts.items():
        total = tally.backoff[job]
        for a in attempts:
            total += launch_s
            name = tally.machine.get((job[0], job[1], a))
            if name is None:
                continue  # refused: no machine, nothing to delete
            total += delete_s
            b = bills.get(name)
            if (job[0], job[1], a) in tally.exited:
                total += job_s
            elif b is not None and b.preempted:
                total += min(b.seconds, job_s)
        out[job] = total
    return out


def pool_statistics() -> dict[str, int] | None:
    """The shared actor pool's counters (actors/pool.py), if actors run on one."""
    try:
        from actor_run.actors.pool import POOL
    except ImportError:
        return None
    stats: dict[str, int] = POOL.statistics()
    return stats


def message_count(runner: Runner) -> tuple[int, str] | None:
    """Actor messages handled so far, from a real counter: the Runner's, else the actor pool's."""
    if hasattr(runner, "statistics"):
        stats = runner.statistics()
        for field in ("messages", "messages_handled", "messages_received"):
            value = stats.get(field) if isinstance(stats, dict) else getattr(stats, field, None)
            if isinstance(value, int):
                return value, "runner.statistics()"
    pool = pool_statistics()
    if pool is not None and isinstance(pool.get("messages"), int):
        return pool["messages"], "actor pool messages handled"
    return None


def is_idle_worker(t: threading.Thread) -> bool:
    # trio keeps idle to_thread workers 10 s; the actor pool keeps a few workers for good. Both hold
    # nothing between jobs; a pool worker still busy after the close is counted (leaked_pool_busy).
    return t.name.startswith(("Trio thread", "Trio worker", "actor-run-pool-"))


def find_leaks(before: set[int | None], sim_dirs: list[Path]) -> dict[str, Any]:
    def left() -> tuple[list[str], list[str], list[str], int]:
        machines = [m for d in sim_dirs if (d / "machines").is_dir() for m in sim_machines(d)]
        actors = [r.actor_class.__name__ for r in [*live_actors(), *pykka.ActorRegistry.get_all()]]
        threads = [t.name for t in threading.enumerate()
                   if t.ident not in before and t.is_alive() and not is_idle_worker(t)]
        pool = pool_statistics()
        busy = 0 if pool is None else pool["workers"] - pool["idle"]
        return machines, actors, threads, busy

    end = time.monotonic() + 10
    machines, actors, threads, busy = left()
    while (machines or actors or threads or busy) and time.monotonic() < end:
        time.sleep(0.1)
        machines, actors, threads, busy = left()
    pool = pool_statistics()
    return {
        "leaks": len(machines) + len(actors) + len(threads) + busy,
        "leaked_machines": machines[:20], "leaked_actors": sorted(Counter(actors).items())[:20],
        "leaked_threads": threads[:20], "leaked_pool_busy": busy,
        "leaked_counts": [len(machines), len(actors), len(threads), busy],
        "pool_workers_left": None if pool is None else pool["workers"],
    }
