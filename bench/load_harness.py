"""Load test: N jobs at once through the real Runner (its actors and its reactor) in one process,
on the `sim` cloud with virtual machines (no process, no folder per machine).

    python bench/load.py --attempts N [--job-seconds S] [--scale F] [--json] [--gc default|cli] [--view]
                         [--failure-rates no_capacity=0.1,launch_failed=0.05,preempt=0.02]

Production intervals are divided by `--scale` (default 10), so a run is short but keeps the
proportions of the real thing: policy poll 5 s, setup grace 600 s, stall 300 s, lost 120 s, first
backoff 1 s (at most 60 s), thrash window 300 s; meter period 60 s; sim launch latency 20 s,
delete latency 5 s. The virtual job itself runs `--job-seconds` (default 30, not scaled: the
configuration bench/RESULTS.md records).

Phases, all in this one process:

0. empty: a Runner opened with nothing submitted, its RSS sampled, closed (the baseline).
1. load: N jobs submitted at once (`concurrency = N`), waited for until every one ended, with the
   failure rates given. Figures below are of this phase.
2. cancel: a fresh Runner (a Runner builds its sim cloud once from the first job's settings, so
   long jobs need their own) runs N virtual jobs of `--cancel-job-seconds` (failure rates 0). Once
   every job said its first `JobStarted`, `runner.cancel()` is called and a thread reads, every
   20 ms, what the sim appended to its billing.jsonl: one line per machine it deletes, written
   just after the machine's file is gone. (Listing the sim's folder instead cost the process up
   to 8 ms of Python per look at N=2000, and a system call per entry that waited for the GIL: the
   watcher slowed what it measured, more the larger N.)
3. leaks: with both Runners closed (waiting up to 10 s for things to settle): machines still held
   by the sim, pykka actors alive, threads not there at the start, and actor-pool workers still
   busy. Idle workers are not counted: trio's ("Trio thread ...", kept 10 s) and the actor
   pool's ("actor-run-pool-...", a few kept for the process's life; `pool_workers_left`).

What is reported (a table, then as the LAST line one JSON object):

- `wall_s`: from the first submit until the last `JobEnded` (submitting is included; `submit_s`
  says how long it took alone). Opening and closing the Runner are not (`close_s` is reported).
- `ideal_s`: the slowest job's own critical path, with zero controller overhead. Per attempt:
  the launch latency (the sim waits it even when it then refuses), plus, if a machine was made,
  the delete latency and the job's time on it: `job_s` if the job exited, the machine's life until
  its preemption (from billing.jsonl, at most `job_s`) if it was preempted first, else 0; per job
  the sum over its attempts plus its `Retrying` backoffs; `ideal_s` is the max over jobs. What the
  ideal leaves out is the controller's: submitting, actor hand-offs, the upload/start/fetch round
  trips, and noticing an exit or a preemption only at the next poll (up to `poll_s` each).
  With failure rates 0 it is launch + job + delete. `wall_over_ideal` = wall_s / ideal_s.
  `overhead_p50_s`/`overhead_p99_s`: per job, (its JobEnded time - its submit time) - its ideal.
- `cpu_s_per_attempt`: process CPU (time.process_time, every thread) during phase 1 divided by
  the attempts actually started (`attempts_run`: N plus the retries); `cpu_user_s`/`cpu_sys_s`
  split it (os.times): a large sys share is threads waking each other.
- messages: actor messages handled during phase 1, from the first real counter there is:
  `runner.statistics()` (a `messages` field), else the shared actor pool's (`actors.pool.POOL`,
  messages handled by every actor); else a proxy: events emitted to subscribers (every kind)
  plus reactor tasks started (`Reactor.statistics().tasks_started`, timers included).
  `messages_source` says which; `events` and `reactor_tasks` are reported either way.
  `messages_per_s` = messages / wall_s; `cpu_s_per_message` = CPU / messages.
- `peak_rss_mib`, `peak_threads`: sampled every 0.1 s in a thread during phase 1.
  `rss_per_attempt_mib` = (peak RSS - `empty_runner_rss_mib`) / N (N attempts run at once).
- `cancel_p50_s`, `cancel_p99_s`, `cancel_max_s`: per machine held at the cancel, the time from
  the `runner.cancel()` call until the sim has billed it (deleted); `cancel_empty_s` until every
  one of them is; `cancel_ended_s` until every job said JobEnded; `cancel_peak_threads` while it ran.
- `leaks`: machines + actors + threads left, each also listed (`leaked_machines`, ...).
- with `--view`, phase 1 also runs the live view (supervisors/view.py) as `actor-run run` does on a
  terminal, drawing into a pseudo-terminal of 50 x 200: `view_cpu_s` is the CPU time of the view's
  thread (every event it took, every redraw), `view_cpu_share` that over the process's CPU in
  phase 1, `view_redraws` and `view_redraws_per_s` how often it drew (at most 4 a second).
- `gc`: `default` (Python's collector settings: the Runner embedded in a process that leaves them)
  or `cli` (`--gc cli`: as the actor-run CLI sets its process, supervisors/gc_tuning.py).
- `file_create_us`, `python_probe_ms`: what a file create costs in the run's folder and how long a
  fixed Python loop takes, both measured before phase 1: the two things outside the controller
  that move its figures most (the disk, and the shared host's speed at the time).

Only loopback: the sim cloud is files in a temporary folder. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import psutil
import pykka
from loguru import logger

from actor_run.protocols.clouds.sim import Billing, billing, sim_machines
from actor_run.protocols.messages import AttemptStarted, Event, Exited, JobEnded, JobStarted, Leased, Retrying
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.gc_tuning import tune_gc
from actor_run.supervisors.runner import Runner

_bill_decoder = msgspec.json.Decoder(Billing)

# production values, divided by --scale
PRODUCTION_POLICY = {
    "poll_s": 5.0, "setup_grace_s": 600.0, "stall_after_s": 300.0, "lost_after_s": 120.0,
    "backoff_s": 1.0, "backoff_max_s": 60.0, "thrash_window_s": 300.0,
}
PRODUCTION_METER_PERIOD_S = 60.0
PRODUCTION_LAUNCH_LATENCY_S = 20.0
PRODUCTION_DELETE_LATENCY_S = 5.0

RATE_NAMES = {
    "no_capacity": "no_capacity_rate", "launch_failed": "launch_failure_rate", "preempt": "preempt_rate",
    "ambiguous": "ambiguous_rate", "boot_failure": "boot_failure_rate",
}
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


def parse_rates(text: str) -> dict[str, float]:
    rates: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in RATE_NAMES:
            raise SystemExit(f"--failure-rates: unknown {name!r} (known: {', '.join(RATE_NAMES)})")
        rates[RATE_NAMES[name]] = float(value)
    return rates


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
        self.cpu: list[tuple[float, float]] = []  # (wall clock, process CPU) per sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        self.peak_threads = max(self.peak_threads, threading.active_count())
        self.cpu.append((time.time(), time.process_time()))

    def cpu_between(self, t0: float, t1: float) -> float:
        """Process CPU seconds between two wall-clock times (to the nearest samples)."""
        inside = [c for t, c in self.cpu if t0 <= t <= t1]
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

    def __call__(self, e: Event) -> None:
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


def sim_settings(n: int, job_s: float, scale: float, rates: dict[str, float],
                 sim_dir: Path) -> dict[str, Any]:
    stock = max(n, 8)
    return {
        "virtual": True, "virtual_job_s": job_s, "seed": 1, "state_dir": str(sim_dir),
        "launch_latency_s": PRODUCTION_LAUNCH_LATENCY_S / scale,
        "delete_latency_s": PRODUCTION_DELETE_LATENCY_S / scale,
        "no_capacity_rate": rates.get("no_capacity_rate", 0.0),
        "launch_failure_rate": rates.get("launch_failure_rate", 0.0),
        "ambiguous_rate": rates.get("ambiguous_rate", 0.0),
        "boot_failure_rate": rates.get("boot_failure_rate", 0.0),
        "preempt_rate": rates.get("preempt_rate", 0.0),
        "preempt_within_s": job_s,
        "regions": [
            {"name": "us-east", "gpus": {"A100": {"stock": stock, "hourly_usd": 1.8}}},
            {"name": "eu-west", "gpus": {"A100": {"stock": stock, "hourly_usd": 2.1}}},
            {"name": "ap-south", "gpus": {"A100": {"stock": stock, "hourly_usd": 1.5}}},
        ],
    }


def make_jobs(n: int, scale: float, clouds: dict[str, Any]) -> list[Job]:
    policy = msgspec.convert({k: v / scale for k, v in PRODUCTION_POLICY.items()}, PolicySpec)
    return [
        Job(name="load", command="true", seed=i, timeout_s=7 * 86400.0, policy=policy,
            candidates=[CandidateSpec(cloud="sim", gpu="A100")], clouds=clouds)
        for i in range(n)
    ]


def open_runner(root: Path, n: int, scale: float) -> Runner:
    root.mkdir(parents=True, exist_ok=True)
    runner = Runner(out_dir=root / "out", state_dir=root, concurrency=n, sweep_on_start=False,
                    meter_period_s=PRODUCTION_METER_PERIOD_S / scale)
    runner.open()
    return runner


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def empty_runner_rss(root: Path, scale: float) -> float:
    """RSS (MiB) with a Runner open and nothing submitted: the most of a few samples."""
    runner = open_runner(root, 1, scale)
    try:
        proc, peak = psutil.Process(), 0
        for _ in range(5):
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.1)
    finally:
        runner.close()
    return peak / MIB


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


class Screen:
    """`--view`: the live view (supervisors/view.py) in a thread of its own, drawing into a pseudo-
    terminal of `rows` x `cols` whose other end a second thread reads and drops (the terminal). The
    view's CPU is the CPU time of its thread: every event it takes and every redraw (the deque's
    append on the emitting actor threads, a few tens of nanoseconds, is not in it)."""

    def __init__(self, keys: list[str], runner: Runner, rows: int = 50, cols: int = 200) -> None:
        import fcntl
        import pty
        import struct
        import termios

        from actor_run.supervisors.views.live import View

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.tty = open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115 (closed in close())
        self.events: collections.deque[Event] = collections.deque()
        self.view = View(keys, json_mode=False, out=self.tty, budget=runner.budget.statistics)  # as `run` has it
        self.n = len(keys)
        self.ended = 0
        self.cpu_s = 0.0
        self.bytes_drawn = 0
        self._view_thread = threading.Thread(target=self._show, name="bench-view", daemon=True)
        self._drain_thread = threading.Thread(target=self._drain, name="bench-terminal", daemon=True)

    def start(self) -> None:
        self._drain_thread.start()
        self._view_thread.start()

    def _until(self, e: Event) -> bool:
        if isinstance(e, JobEnded):
            self.ended += 1
        return self.ended >= self.n

    def _show(self) -> None:
        t = time.thread_time()
        with self.view:
            self.view.follow(self.events, self._until)
        self.cpu_s = time.thread_time() - t

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 1 << 16)
            except OSError:
                return
            if not data:
                return
            self.bytes_drawn += len(data)

    def close(self, timeout: float) -> None:
        self._view_thread.join(timeout)
        self.tty.close()
        os.close(self.master)
        self._drain_thread.join(5)


def phase_load(root: Path, n: int, job_s: float, scale: float, rates: dict[str, float],
               view: bool = False) -> dict[str, Any]:
    sim_dir = root / "sim"
    launch_s, delete_s = PRODUCTION_LAUNCH_LATENCY_S / scale, PRODUCTION_DELETE_LATENCY_S / scale
    jobs = make_jobs(n, scale, {"sim": sim_settings(n, job_s, scale, rates, sim_dir)})
    runner = open_runner(root, n, scale)
    tally = Tally()
    runner.subscribe(tally)
    screen = Screen([j.key for j in jobs], runner) if view else None
    if screen is not None:
        runner.subscribe(screen.events.append)
        screen.start()
    timeout = 300 + 20 * (launch_s + job_s + delete_s) + 0.1 * n
    timed_out = False
    try:
        with Sampler() as sampler:
            tasks0 = runner.reactor.statistics().tasks_started
            msgs0 = message_count(runner)
            submitted: dict[tuple[str, int], float] = {}
            times0 = os.times()
            cpu0, t0, wall0 = time.process_time(), time.perf_counter(), time.time()
            for job in jobs:
                submitted[(job.name, job.seed)] = time.time()
                runner.submit(job)
            submit_s = time.perf_counter() - t0
            try:
                runner.wait(timeout=timeout)
            except TimeoutError:
                timed_out = True
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            times1 = os.times()
            tasks = runner.reactor.statistics().tasks_started - tasks0
            msgs1 = message_count(runner)
    finally:
        close_s = timed(runner.close)
    shown: dict[str, Any] = {}
    if screen is not None:
        screen.close(timeout=30)
        stats = screen.view.statistics()
        shown = {"view_cpu_s": screen.cpu_s, "view_cpu_share": screen.cpu_s / max(cpu, 1e-9),
                 "view_redraws": stats.redraws, "view_redraws_per_s": stats.redraws / wall,
                 "view_events": stats.events, "view_bytes": screen.bytes_drawn}
    with tally.lock:
        events = tally.events
        kinds = dict(tally.kinds)
        ended = dict(tally.ended)
        steps = {k: [percentile(v, 50), percentile(v, 99)] for k, v in tally.steps.items() if len(v) >= 10}
        marks = {k: (min(v), max(v)) for k, v in tally.marks.items()}
    last_ended = max((e.t for e in ended.values()), default=wall0)
    bursts = {}
    if "JobStarted" in marks and "Exited" in marks:
        start_end, end_start = marks["JobStarted"][1], marks["Exited"][0]
        bursts = {"start_burst_s": start_end - wall0, "start_burst_cpu_s": sampler.cpu_between(wall0, start_end),
                  "end_burst_s": last_ended - end_start,
                  "end_burst_cpu_s": sampler.cpu_between(end_start, last_ended)}
    if msgs0 is not None and msgs1 is not None:
        messages, source = msgs1[0] - msgs0[0], msgs1[1]
    else:
        messages, source = events + tasks, "events + reactor tasks started"
    ideals = ideal_per_job(tally, sim_dir, job_s, launch_s, delete_s)
    ideal = max(ideals.values(), default=launch_s + job_s + delete_s)
    overheads = [e.t - submitted[k] - ideals.get(k, 0.0) for k, e in ended.items()]
    attempts_run = kinds.get("AttemptStarted", 0)
    outcomes = Counter(e.outcome if e.outcome == "succeeded" else f"failed:{e.failure}"
                       for e in ended.values())
    return {
        "wall_s": wall, "ideal_s": ideal, "wall_over_ideal": wall / ideal,
        "submit_s": submit_s, "close_s": close_s,
        "timed_out": timed_out, "jobs_ended": len(ended), "outcomes": dict(outcomes),
        "attempts_run": attempts_run, "retries": kinds.get("Retrying", 0),
        "cpu_s": cpu, "cpu_user_s": times1.user - times0.user, "cpu_sys_s": times1.system - times0.system,
        "cpu_s_per_attempt": cpu / max(1, attempts_run),
        "messages": messages, "messages_source": source, "events": events, "reactor_tasks": tasks,
        "messages_per_s": messages / wall, "cpu_s_per_message": cpu / max(1, messages),
        "peak_rss_mib": sampler.peak_rss / MIB, "peak_threads": sampler.peak_threads,
        "overhead_p50_s": percentile(overheads, 50), "overhead_p99_s": percentile(overheads, 99),
        "overhead_max_s": max(overheads, default=0.0), "events_by_kind": kinds,
        "steps_p50_p99_s": steps, **bursts,
        "timeline_s": {k: [round(a - wall0, 3), round(b - wall0, 3)] for k, (a, b) in marks.items()},
        **shown,
    }


class GoneWatcher:
    """From `arm()` on, reads the lines the sim appends to billing.jsonl every 20 ms; notes when
    each machine held at `arm()` is billed, that is deleted."""

    def __init__(self, sim_dir: Path, timeout_s: float) -> None:
        self.sim_dir = sim_dir
        self.timeout_s = timeout_s
        self.gone: dict[str, float] = {}
        self.empty_s: float | None = None
        self.held: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="bench-gone-watcher", daemon=True)

    def arm(self) -> None:
        self.held = set(sim_machines(self.sim_dir))
        bills = self.sim_dir / "billing.jsonl"
        self._offset = bills.stat().st_size if bills.exists() else 0
        self.t0 = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        bills = self.sim_dir / "billing.jsonl"
        partial = b""
        with contextlib.ExitStack() as files:
            f = None
            while True:
                if f is None and bills.exists():
                    f = files.enter_context(open(bills, "rb"))
                    f.seek(self._offset)
                lines = (partial + (f.read() if f is not None else b"")).split(b"\n")
                partial = lines.pop()  # a line being written
                dt = time.perf_counter() - self.t0
                for line in lines:
                    name = _bill_decoder.decode(line).name
                    if name in self.held:
                        self.gone.setdefault(name, dt)
                if len(self.gone) == len(self.held):
                    self.empty_s = dt
                    return
                if dt > self.timeout_s:
                    return
                time.sleep(0.02)

    def join(self) -> None:
        self._thread.join(self.timeout_s + 5)


def phase_cancel(root: Path, n: int, job_s: float, scale: float) -> dict[str, Any]:
    sim_dir = root / "sim"
    jobs = make_jobs(n, scale, {"sim": sim_settings(n, job_s, scale, {}, sim_dir)})
    runner = open_runner(root, n, scale)
    tally = Tally()
    tally.expect = n
    runner.subscribe(tally)
    launch_s = PRODUCTION_LAUNCH_LATENCY_S / scale
    watcher = GoneWatcher(sim_dir, timeout_s=runner.delete_timeout_s + 180)
    ended_s = None
    try:
        t0 = time.perf_counter()
        for job in jobs:
            runner.submit(job)
        all_started = tally.all_started.wait(120 + 10 * launch_s + 0.1 * n)
        to_running_s = time.perf_counter() - t0
        with tally.lock:
            running = len(tally.started_jobs)
        with Sampler() as sampler:
            watcher.arm()
            runner.cancel()
            try:
                runner.wait(timeout=runner.delete_timeout_s + 180)
                ended_s = time.perf_counter() - watcher.t0
            except TimeoutError:
                pass
            watcher.join()
    finally:
        close_s = timed(runner.close)
    times = list(watcher.gone.values())
    return {
        "cancel_all_started": all_started, "cancel_running_at_cancel": running,
        "cancel_to_running_s": to_running_s,
        "cancel_machines_at_cancel": len(watcher.held), "cancel_machines_gone": len(times),
        "cancel_p50_s": percentile(times, 50), "cancel_p99_s": percentile(times, 99),
        "cancel_max_s": max(times, default=0.0), "cancel_empty_s": watcher.empty_s,
        "cancel_ended_s": ended_s, "cancel_close_s": close_s, "cancel_peak_threads": sampler.peak_threads,
    }


def is_idle_worker(t: threading.Thread) -> bool:
    # trio keeps idle to_thread workers 10 s; the actor pool keeps a few workers for good. Both hold
    # nothing between jobs; a pool worker still busy after the close is counted (leaked_pool_busy).
    return t.name.startswith(("Trio thread", "Trio worker", "actor-run-pool-"))


def find_leaks(before: set[int | None], sim_dirs: list[Path]) -> dict[str, Any]:
    def left() -> tuple[list[str], list[str], list[str], int]:
        machines = [m for d in sim_dirs if (d / "machines").is_dir() for m in sim_machines(d)]
        actors = [r.actor_class.__name__ for r in pykka.ActorRegistry.get_all()]
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


def render(r: dict[str, Any]) -> str:
    def s3(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows = [
        ("attempts (at once)", f"{r['attempts']}"),
        ("scale (production / run)", f"{r['scale']:g}"),
        ("job seconds", f"{r['job_s']:g}"),
        ("folder / a file create there", f"{r['dir']} / {r['file_create_us']:.0f} us"),
        ("reference Python loop (machine speed)", f"{r['python_probe_ms']:.1f} ms"),
        ("garbage collector", "as the actor-run CLI sets it" if r["gc"] == "cli" else "Python defaults"),
        ("attempts run (with retries)", f"{r['attempts_run']}"),
        ("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))),
        ("wall / ideal", f"{r['wall_s']:.2f} s / {r['ideal_s']:.2f} s = {r['wall_over_ideal']:.3f}"),
        ("submit / close", f"{r['submit_s']:.2f} s / {r['close_s']:.2f} s"),
        ("overhead per job p50 / p99 / max",
         f"{r['overhead_p50_s']:.2f} / {r['overhead_p99_s']:.2f} / {r['overhead_max_s']:.2f} s"),
        ("CPU (user + sys)", f"{r['cpu_s']:.2f} s ({r['cpu_user_s']:.2f} + {r['cpu_sys_s']:.2f})"),
        ("CPU per attempt / per message",
         f"{r['cpu_s_per_attempt'] * 1000:.1f} ms / {r['cpu_s_per_message'] * 1e6:.0f} us"),
        ("messages", f"{r['messages']} ({r['messages_source']}) = {r['messages_per_s']:.0f}/s"),
        ("RSS peak / empty Runner", f"{r['peak_rss_mib']:.1f} / {r['empty_runner_rss_mib']:.1f} MiB"),
        ("RSS per attempt", f"{r['rss_per_attempt_mib']:.3f} MiB"),
        ("threads at peak", f"{r['peak_threads']}"),
    ]
    if "start_burst_s" in r:
        rows += [
            ("start burst: submit -> last JobStarted",
             f"{r['start_burst_s']:.2f} s wall, {r['start_burst_cpu_s']:.2f} s CPU"),
            ("end burst: first Exited -> last JobEnded",
             f"{r['end_burst_s']:.2f} s wall, {r['end_burst_cpu_s']:.2f} s CPU"),
        ]
    rows += [(f"  step {k} p50 / p99", f"{v[0]:.2f} / {v[1]:.2f} s") for k, v in r["steps_p50_p99_s"].items()]
    rows += [(f"  {k} first / last", f"{v[0]:.2f} / {v[1]:.2f} s") for k, v in r.get("timeline_s", {}).items()]
    if "cancel_p50_s" in r:
        rows += [
            ("cancel: running at cancel",
             f"{r['cancel_running_at_cancel']} jobs, {r['cancel_machines_at_cancel']} machines"),
            ("cancel -> deleted p50 / p99 / max",
             f"{s3(r['cancel_p50_s'])} / {s3(r['cancel_p99_s'])} / {s3(r['cancel_max_s'])} s"),
            ("cancel -> sim empty / all ended", f"{s3(r['cancel_empty_s'])} s / {s3(r['cancel_ended_s'])} s"),
            ("threads at peak while cancelling", f"{r['cancel_peak_threads']}"),
        ]
    if "view_cpu_s" in r:
        rows += [
            ("view: CPU / share of the process's", f"{r['view_cpu_s']:.3f} s / {r['view_cpu_share'] * 100:.2f} %"),
            ("view: redraws (per second)", f"{r['view_redraws']} ({r['view_redraws_per_s']:.2f}/s)"),
        ]
    rows.append(("leaks (machines, actors, threads, busy pool)", f"{r['leaks']} {r['leaked_counts']}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, required=True, help="jobs run at once")
    ap.add_argument("--job-seconds", type=float, default=30.0,
                    help="how long each virtual job runs (not scaled)")
    ap.add_argument("--failure-rates", default="",
                    help="e.g. no_capacity=0.1,launch_failed=0.05,preempt=0.02")
    ap.add_argument("--scale", type=float, default=10.0, help="production intervals are divided by this")
    ap.add_argument("--cancel-job-seconds", type=float, default=600.0, help="the cancel phase's job length")
    ap.add_argument("--no-cancel", action="store_true", help="skip the cancel phase")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--view", action="store_true",
                    help="phase 1 with the live view drawing into a pseudo-terminal (50 x 200); reports the "
                         "view's share of the process's CPU")
    ap.add_argument("--gc", choices=("default", "cli"), default="default",
                    help="the garbage collector: Python's defaults (the Runner embedded in a process that "
                         "leaves them), or as the actor-run CLI sets it (supervisors/gc_tuning.py)")
    ap.add_argument("--dir", default=None,
                    help="where the run's folders go (out, ledger, sim): a new temporary folder in it "
                         "(default: the system's temporary folder)")
    args = ap.parse_args(argv)
    if args.attempts < 1 or args.scale <= 0 or args.job_seconds < 0:
        ap.error("--attempts >= 1, --scale > 0, --job-seconds >= 0")
    rates = parse_rates(args.failure_rates)
    logger.remove()
    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    f = args.scale
    say(f"scale factor {f:g}: production intervals / {f:g} (poll {PRODUCTION_POLICY['poll_s'] / f:g} s, "
        f"launch {PRODUCTION_LAUNCH_LATENCY_S / f:g} s, delete {PRODUCTION_DELETE_LATENCY_S / f:g} s, "
        f"meter {PRODUCTION_METER_PERIOD_S / f:g} s)")

    before = {t.ident for t in threading.enumerate()}
    with tempfile.TemporaryDirectory(prefix="actor-run-load-", dir=args.dir) as tmp:
        root = Path(tmp)
        result: dict[str, Any] = {"attempts": args.attempts, "scale": args.scale, "job_s": args.job_seconds,
                                  "failure_rates": rates, "dir": str(root.parent),
                                  "file_create_us": file_create_us(root), "python_probe_ms": python_probe_ms()}
        say(f"folder {root.parent}: a file create costs {result['file_create_us']:.0f} us there (median)")
        say(f"this machine's speed now: the reference Python loop takes {result['python_probe_ms']:.1f} ms")
        result["empty_runner_rss_mib"] = empty_runner_rss(root / "empty", args.scale)
        if args.gc == "cli":
            tune_gc()
        result["gc"] = args.gc
        say(f"garbage collector: {'as the actor-run CLI sets it' if args.gc == 'cli' else 'Python defaults'}"
            f" (thresholds {gc.get_threshold()}, {gc.get_freeze_count()} objects frozen)")
        say(f"phase 1: {args.attempts} jobs of {args.job_seconds:g} s at once")
        result.update(phase_load(root / "load", args.attempts, args.job_seconds, args.scale, rates, view=args.view))
        grown = result["peak_rss_mib"] - result["empty_runner_rss_mib"]
        result["rss_per_attempt_mib"] = grown / args.attempts
        sim_dirs = [root / "load" / "sim"]
        if not args.no_cancel:
            say(f"phase 2: {args.attempts} jobs of {args.cancel_job_seconds:g} s, cancelled once all run")
            result.update(phase_cancel(root / "cancel", args.attempts, args.cancel_job_seconds, args.scale))
            sim_dirs.append(root / "cancel" / "sim")
        result.update(find_leaks(before, sim_dirs))
    say(render(result))
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in result.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
