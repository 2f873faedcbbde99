"""bench/load.py's harness: the sim cloud at production values divided by --scale, the jobs, the
Runner, and the two phases (a load of N attempts; a cancel of N running jobs). load.py runs them."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import psutil
from load_figures import MIB, Collections, Sampler, Tally, _bill_decoder, ideal_per_job, message_count, percentile

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.protocols.messages import Event, JobEnded
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.api.runner import Runner

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


def parse_rates(text: str) -> dict[str, float]:
    rates: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in RATE_NAMES:
            raise SystemExit(f"--failure-rates: unknown {name!r} (known: {', '.join(RATE_NAMES)})")
        rates[RATE_NAMES[name]] = float(value)
    return rates


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


RUNNER_TUNES_GC = [False]  # load.py's --gc runner|cli: the Runner raises the collector's thresholds


def open_runner(root: Path, n: int, scale: float) -> Runner:
    root.mkdir(parents=True, exist_ok=True)
    runner = Runner(out_dir=root / "out", state_dir=root, concurrency=n, sweep_on_start=False,
                    meter_period_s=PRODUCTION_METER_PERIOD_S / scale, tune_gc=RUNNER_TUNES_GC[0])
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


class Screen:
    """`--view`: the live view (supervisors/views/live.py) in a thread of its own, drawing into a pseudo-
    terminal of `rows` x `cols` whose other end a second thread reads and drops (the terminal). The
    view's CPU is the CPU time of its thread: every event it takes and every redraw (the deque's
    append on the emitting actor threads, a few tens of nanoseconds, is not in it: the view itself
    runs nothing on them)."""

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
        with Sampler() as sampler, Collections() as passes:
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
        events, kinds = tally.counts()
        ended = dict(tally.ended)
        steps = {k: [percentile(v, 50), percentile(v, 99)] for k, v in tally.steps.items() if len(v) >= 10}
        marks = {k: (min(v), max(v)) for k, v in tally.marks.items()}
    last_ended = max((e.t for e in ended.values()), default=wall0)
    bursts = {}
    if "JobStarted" in marks and "Exited" in marks:
        start_end, end_start = marks["JobStarted"][1], marks["Exited"][0]
        bursts = {"start_burst_s": start_end - wall0, "start_burst_cpu_s": sampler.cpu_between(wall0, start_end),
                  "end_burst_s": last_ended - end_start,
                  "end_burst_cpu_s": sampler.cpu_between(end_start, last_ended),
                  "start_burst_sys_s": sampler.sys_between(wall0, start_end),
                  "end_burst_sys_s": sampler.sys_between(end_start, last_ended),
                  "start_burst_gc": passes.between(wall0, start_end),
                  "end_burst_gc": passes.between(end_start, last_ended)}
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
        "gc_full": passes.full, "gc_full_s": passes.full_s, "gc_all_s": passes.all_s,
        "gc_by_generation": passes.by_generation,
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
        with Sampler() as sampler, Collections() as passes:
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
        "cancel_gc_full": passes.full, "cancel_gc_full_s": passes.full_s, "cancel_gc_all_s": passes.all_s,
    }
