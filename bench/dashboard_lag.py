"""The dashboard's update lag at N running jobs: how long after a job's end is in the ledger the page's
stream (`actor-run dashboard`'s /events, in a process of its own) shows it.

    python bench/dashboard_lag.py [--jobs 1000] [--job-seconds 60] [--dir /dev/shm]

N virtual sim jobs (bench/load_harness.py's sim, production intervals / 10) run at once through the
real Runner in this process; their ends come spread over the last part of the run. A thread reads
the dashboard's stream like the page does (one JSON snapshot per message) and notes when each job is
first shown ended; the lag of a job is that moment minus its JobEnded's time. Prints the lags' p50,
p99 and max, and how long a snapshot took the server (the stream's gaps minus the push period) as a
JSON line. Everything is on loopback; the folder is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from load_figures import percentile
from load_harness import make_jobs, open_runner, sim_settings

from actor_run.protocols.messages import Event, JobEnded


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--job-seconds", type=float, default=60.0)
    ap.add_argument("--dir", default=None, help="where the run's folder goes (default: the system's temp)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="actor-run-dash-", dir=args.dir))
    try:
        return run(root, args.jobs, args.job_seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, n: int, job_s: float) -> int:
    runner = open_runner(root, n, 10.0)
    ended_at: dict[str, float] = {}
    shown_at: dict[str, float] = {}
    gaps: list[float] = []

    def note(e: Event) -> None:
        if isinstance(e, JobEnded):
            ended_at[f"{e.job}/seed-{e.seed}"] = e.t

    runner.subscribe(note)
    board = subprocess.Popen([sys.executable, "-m", "actor_run", "dashboard", "--ledger", str(runner.ledger_path),
                              "--state-dir", str(root), "--port", "0"], stdout=subprocess.PIPE, text=True)
    assert board.stdout is not None
    found = re.search(r"(http://\S+)", board.stdout.readline())
    assert found
    base = found.group(1).partition("?")[0]
    stop = threading.Event()

    def follow() -> None:
        last = None
        with httpx.stream("GET", base + "events", timeout=None) as stream:
            for line in stream.iter_lines():
                if stop.is_set():
                    return
                if not line.startswith("data: "):
                    continue
                now = time.time()
                if last is not None:
                    gaps.append(now - last)
                last = now
                for job in json.loads(line[6:])["jobs"]:
                    if job["state"] in ("succeeded", "failed", "canceled") and job["key"] not in shown_at:
                        shown_at[job["key"]] = now

    reader = threading.Thread(target=follow, name="bench-follow", daemon=True)
    reader.start()
    try:
        clouds = {"sim": sim_settings(n, job_s, 10.0, {}, root / "sim")}
        handles = [runner.submit(j) for j in make_jobs(n, 10.0, clouds)]
        for h in handles:
            h.result(job_s * 20 + 600)
        end = time.monotonic() + 30
        while len(shown_at) < len(ended_at) and time.monotonic() < end:
            time.sleep(0.2)
    finally:
        stop.set()
        board.terminate()
        board.wait(30)
        runner.close()
    lags = sorted(shown_at[k] - ended_at[k] for k in ended_at if k in shown_at)
    figures = {"jobs": n, "shown": len(lags), "lag_p50_s": round(percentile(lags, 50), 3),
               "lag_p99_s": round(percentile(lags, 99), 3), "lag_max_s": round(lags[-1], 3) if lags else None,
               "stream_gap_p50_s": round(percentile(sorted(gaps), 50), 3),
               "stream_gap_max_s": round(max(gaps), 3) if gaps else None}
    print(json.dumps(figures))
    return 0 if len(lags) == n else 1


if __name__ == "__main__":
    sys.exit(main())
