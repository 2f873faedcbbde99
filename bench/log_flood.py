"""The controller's memory under jobs that print without end (issue 48.4): `--jobs` seeds on the
local cloud, each writing `--mb` MB of progress lines and `--mb` MB of plain log as fast as it can,
then exiting 0. The controller (`actor-run run --json`, its events to /dev/null) is sampled with
psutil every 50 ms until it exits; the figure is its peak RSS, beside the RSS of the same controller
running the same seeds printing nothing (the floor).

Prints a line per run, then as its last line one JSON object:
{"jobs": N, "mb": M, "peak_rss_mb": ..., "floor_rss_mb": ..., "seconds": ..., "log_txt_mb": ...}.

    python bench/log_flood.py [--jobs 10] [--mb 200] [--exe .venv/bin/actor-run]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent

JOB = r"""
import os, sys
mb = int(os.environ["MB"])
pad = "p" * 60
line = "%09d " + "x" * 90 + "\n"
with open(os.environ["ACTOR_RUN_PROGRESS"], "a") as f:
    out = sys.stdout
    for i in range(mb * 10_000):  # about 100 bytes a line, to each
        f.write('{"stage": "train", "step": %9d, "pad": "%s"}\n' % (i, pad))
        out.write(line % i)
print("done", flush=True)
"""


def run(exe: str, jobs: int, mb: int, where: Path) -> tuple[float, float, float]:
    """(peak RSS in MB, seconds, MB of log.txt kept in all) of one run."""
    code = where / "code"
    code.mkdir(parents=True)
    (code / "job.py").write_text(JOB)
    batch = where / "flood.toml"
    batch.write_text(f"""
[job]
name = "flood"
command = "python3 job.py"
code = "code"
seeds = {list(range(1, jobs + 1))}
timeout_s = 3600
env = {{ MB = "{mb}" }}

[policy]
max_attempts = 1
concurrency = {jobs}
poll_s = 0.5
""")
    t0 = time.monotonic()
    proc = subprocess.Popen([exe, "run", str(batch), "--json", "--out", str(where / "out"), "--state-dir",
                             str(where / "state")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=where)
    ps = psutil.Process(proc.pid)
    peak = 0
    while True:
        try:
            peak = max(peak, ps.memory_info().rss)
            proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            continue
        except psutil.NoSuchProcess:
            proc.wait()
            break
    seconds = time.monotonic() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        sys.exit(f"the run failed ({proc.returncode}): {err[-2000:]}")
    kept = sum(p.stat().st_size for p in (where / "out").glob("latest/flood/seed-*/log.txt"))
    return peak / 1e6, seconds, kept / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--exe", default=shutil.which("actor-run") or str(ROOT / ".venv" / "bin" / "actor-run"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="actor-run-flood-") as tmp:
        floor, floor_s, _ = run(args.exe, args.jobs, 0, Path(tmp) / "floor")
        print(f"floor: {args.jobs} jobs printing nothing: peak RSS {floor:.0f} MB in {floor_s:.1f} s")
        peak, seconds, kept = run(args.exe, args.jobs, args.mb, Path(tmp) / "flood")
        print(f"flood: {args.jobs} jobs x {args.mb} MB of progress lines and {args.mb} MB of log: "
              f"peak RSS {peak:.0f} MB in {seconds:.1f} s; log.txt kept {kept:.0f} MB in all")
    print(json.dumps({"jobs": args.jobs, "mb": args.mb, "peak_rss_mb": round(peak), "floor_rss_mb": round(floor),
                      "seconds": round(seconds, 1), "log_txt_mb": round(kept)}))


if __name__ == "__main__":
    main()
