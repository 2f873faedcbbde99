"""How the controller's costs grow with N: runs `bench/load.py --attempts N --json` once per N, each
in a fresh process, and writes

    bench/out/curve.json   one object per N: load.py's JSON line (or the error of that run)
    bench/out/curve.md     each figure per N, then its growth between successive N
    bench/out/curve.png    wall_over_ideal, cpu_s_per_attempt, rss_per_attempt_mib, peak_threads,
                           cancel_p99_s and messages_per_s against N

Growth between N1 and N2 (N2 > N1) of a figure going from f1 to f2, two ways:
- ratio = (f2 / f1) / (N2 / N1): 1.0 when the figure grows linearly with N; a figure that stays
  flat (a good per-attempt cost, a good latency) shows N1 / N2.
- exponent = log(f2 / f1) / log(N2 / N1): 0 flat, 1 linear, 2 quadratic, whatever the N step.

    python bench/curve.py [--ns 100,300,1000,2000] [--job-seconds S] [--scale F] [--failure-rates ...]
                          [--dir D] [--gc default|runner|cli]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
LOAD = BENCH / "load.py"

FIGURES = [
    "wall_s", "ideal_s", "wall_over_ideal", "submit_s", "overhead_p50_s", "overhead_p99_s", "attempts_run",
    "cpu_s", "cpu_user_s", "cpu_sys_s", "cpu_s_per_attempt", "cpu_s_per_message",
    "messages", "messages_per_s",
    "peak_rss_mib", "empty_runner_rss_mib", "rss_per_attempt_mib", "peak_threads",
    "cancel_p50_s", "cancel_p99_s", "cancel_max_s", "cancel_empty_s", "cancel_peak_threads",
    "start_burst_s", "start_burst_cpu_s", "end_burst_s", "end_burst_cpu_s", "file_create_us", "python_probe_ms",
    "close_s", "leaks",
]
PLOTTED = ["wall_over_ideal", "cpu_s_per_attempt", "rss_per_attempt_mib", "peak_threads", "cancel_p99_s",
           "messages_per_s"]


def run_one(n: int, extra: list[str], timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, str(LOAD), "--attempts", str(n), "--json", *extra]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"attempts": n, "error": f"timed out after {timeout_s:g} s"}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = proc.stderr[-2000:]
        return {"attempts": n, "error": f"exit {proc.returncode}, no JSON line; stderr: {tail}"}
    result["process_s"] = time.perf_counter() - t
    if proc.returncode != 0:
        result["error"] = f"exit {proc.returncode}"
    return result


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        return f"{v:.4f}" if a < 0.1 else f"{v:.3f}" if a < 10 else f"{v:.1f}" if a < 1000 else f"{v:.0f}"
    return str(v)


def growth(f1: Any, f2: Any, n1: int, n2: int) -> tuple[float | None, float | None]:
    if not isinstance(f1, int | float) or not isinstance(f2, int | float) or f1 <= 0 or f2 <= 0:
        return None, None
    return (f2 / f1) / (n2 / n1), math.log(f2 / f1) / math.log(n2 / n1)


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    ok = [r for r in results if "error" not in r]
    ns = [r["attempts"] for r in ok]
    out = [f"# Load curve: {', '.join(map(str, ns))} attempts at once",
           "",
           f"`bench/load.py --attempts N --json {' '.join(load_args(args))}`, one process per N "
           f"(scale {ok[0]['scale'] if ok else '?'}, job {ok[0]['job_s'] if ok else '?'} s).",
           ""]
    for r in results:
        if "error" in r:
            out += [f"**N = {r['attempts']} failed**: {r['error'][:400]}", ""]
    if not ok:
        return "\n".join(out) + "\n"
    out += ["| figure | " + " | ".join(f"N={n}" for n in ns) + " |",
            "|---|" + "---:|" * len(ns)]
    for f in FIGURES:
        out.append(f"| {f} | " + " | ".join(fmt(r.get(f)) for r in ok) + " |")
    steps = list(itertools.pairwise(ok))
    if steps:
        for title, which, note in (
            ("Growth ratio (f2/f1)/(N2/N1)", 0, "1.0 = grows linearly with N; flat = N1/N2"),
            ("Growth exponent log(f2/f1)/log(N2/N1)", 1, "0 = flat, 1 = linear, 2 = quadratic"),
        ):
            out += ["", f"## {title}", "", note, "",
                    "| figure | " + " | ".join(f"{a['attempts']}→{b['attempts']}" for a, b in steps) + " |",
                    "|---|" + "---:|" * len(steps)]
            for f in FIGURES:
                cells = [growth(a.get(f), b.get(f), a["attempts"], b["attempts"])[which] for a, b in steps]
                out.append(f"| {f} | " + " | ".join(fmt(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if "error" not in r]
    ns = [r["attempts"] for r in ok]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, f in zip(axes.flat, PLOTTED, strict=True):
        ax.plot(ns, [r.get(f) or 0 for r in ok], marker="o")
        ax.set_title(f)
        ax.set_xlabel("N (attempts at once)")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)  # small variations must not look like cliffs
        if len(ns) > 1 and max(ns) / min(ns) >= 10:
            ax.set_xscale("log")
    fig.suptitle("actor-run load curve (bench/load.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_args(args: argparse.Namespace) -> list[str]:
    extra = []
    if args.job_seconds is not None:
        extra += ["--job-seconds", f"{args.job_seconds:g}"]
    if args.scale is not None:
        extra += ["--scale", f"{args.scale:g}"]
    if args.failure_rates:
        extra += ["--failure-rates", args.failure_rates]
    if args.dir:
        extra += ["--dir", args.dir]
    if args.gc:
        extra += ["--gc", args.gc]
    return extra


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="100,300,1000,2000", help="comma-separated N values")
    ap.add_argument("--job-seconds", type=float, default=None)
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--failure-rates", default="")
    ap.add_argument("--dir", default=None, help="load.py's --dir: where each run's folders go")
    ap.add_argument("--gc", default=None, choices=("default", "runner", "cli"), help="load.py's --gc")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per N, seconds")
    ap.add_argument("--out", default=str(BENCH / "out"))
    args = ap.parse_args(argv)
    ns = sorted({int(x) for x in args.ns.split(",") if x.strip()})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in ns:
        print(f"N = {n} ...", end=" ", flush=True)
        r = run_one(n, load_args(args), args.timeout)
        results.append(r)
        if "error" in r:
            print(f"FAILED: {r['error'][:300]}", flush=True)
        else:
            print(f"wall/ideal {r['wall_over_ideal']:.3f}, "
                  f"cpu/attempt {r['cpu_s_per_attempt'] * 1000:.1f} ms, "
                  f"rss/attempt {r['rss_per_attempt_mib']:.3f} MiB, threads {r['peak_threads']}, "
                  f"cancel p99 {r.get('cancel_p99_s', 0):.2f} s, leaks {r['leaks']} ({r['process_s']:.0f} s)",
                  flush=True)
    (out / "curve.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "curve.md").write_text(markdown(results, args))
    try:
        plot(results, out / "curve.png")
    except ImportError:
        print(f"wrote {out / 'curve.json'}, {out / 'curve.md'}; no plot: matplotlib is not installed "
              "(pip install -e '.[bench]')", file=sys.stderr)
        return 1
    print(f"wrote {out / 'curve.json'}, {out / 'curve.md'}, {out / 'curve.png'}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
