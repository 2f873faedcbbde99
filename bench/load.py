"""Load test: N jobs at once through the real Runner (its actors and its reactor) in one process,
on the `sim` cloud with virtual machines (no process, no folder per machine).

    python bench/load.py --attempts N [--job-seconds S] [--scale F] [--json] [--gc default|runner|cli] [--view]
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
- with `--view`, phase 1 also runs the live view (supervisors/views/live.py) as `actor-run run` does on a
  terminal, drawing into a pseudo-terminal of 50 x 200: `view_cpu_s` is the CPU time of the view's
  thread (every event it took, every redraw), `view_cpu_share` that over the process's CPU in
  phase 1, `view_redraws` and `view_redraws_per_s` how often it drew (at most 4 a second).
- `gc_full`, `gc_full_s`, `gc_all_s` (and `cancel_gc_*` for the cancel's window, from the cancel until
  every job ended): the collector's full collections in phase 1, the seconds they took, and the
  seconds of all its passes (every thread stopped meanwhile); `gc_by_generation`: per generation
  (young, middle, full), [passes, seconds, objects collected].
- `gc`: `runner` (the default since item 46 of bench/RESULTS.md: what a Runner does by itself,
  thresholds raised while it is open), `default` (Python's collector settings:
  `Runner(tune_gc=False)`, what every run before item 46 measured) or `cli` (`--gc cli`: as the
  actor-run CLI sets its process, supervisors/api/gc_tuning.py).
- `file_create_us`, `python_probe_ms`: what a file create costs in the run's folder and how long a
  fixed Python loop takes, both measured before phase 1: the two things outside the controller
  that move its figures most (the disk, and the shared host's speed at the time).

Only loopback: the sim cloud is files in a temporary folder. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from load_figures import file_create_us, find_leaks, python_probe_ms
from load_harness import (
    PRODUCTION_DELETE_LATENCY_S,
    PRODUCTION_LAUNCH_LATENCY_S,
    PRODUCTION_METER_PERIOD_S,
    PRODUCTION_POLICY,
    RUNNER_TUNES_GC,
    empty_runner_rss,
    parse_rates,
    phase_cancel,
    phase_load,
)
from loguru import logger

from actor_run.supervisors.api.gc_tuning import tune_gc

GC_MODES = {
    "default": "Python defaults (Runner(tune_gc=False))",
    "runner": "the Runner's (thresholds raised while it is open)",
    "cli": "as the actor-run CLI sets it (frozen, thresholds raised)",
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
        ("garbage collector", GC_MODES[r["gc"]]),
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
        def burst(which: str) -> str:
            gc_passes, gc_s = r[f"{which}_burst_gc"]
            return (f"{r[f'{which}_burst_s']:.2f} s wall, {r[f'{which}_burst_cpu_s']:.2f} s CPU "
                    f"({r.get(f'{which}_burst_sys_s', 0.0):.2f} s in the kernel; collector: {gc_passes} passes, "
                    f"{gc_s:.2f} s)")
        rows += [("start burst: submit -> last JobStarted", burst("start")),
                 ("end burst: first Exited -> last JobEnded", burst("end"))]
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
    def passes(prefix: str) -> str:
        return f"{r[prefix + 'full']} ({r[prefix + 'full_s']:.2f} s) / {r[prefix + 'all_s']:.2f} s"

    rows.append(("collector: full passes (s) / all passes", passes("gc_")))
    if "cancel_gc_full" in r:
        rows.append(("  while cancelling", passes("cancel_gc_")))
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
    ap.add_argument("--gc", choices=tuple(GC_MODES), default="runner",
                    help="the garbage collector: Python's defaults (Runner(tune_gc=False)), the Runner's "
                         "raised thresholds while open (its default), or as the actor-run CLI sets it "
                         "(supervisors/api/gc_tuning.py)")
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
        RUNNER_TUNES_GC[0] = args.gc != "default"
        result["gc"] = args.gc
        say(f"garbage collector: {GC_MODES[args.gc]}"
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
