"""bench/load.py, run as a user runs it (a small N, short intervals, the live view on a
pseudo-terminal): it completes, every job ends, nothing leaks, and its last line is the JSON object
the load issue names. No figure is timed here: speed is measured by the bench itself, not by
tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("attempts", "wall_over_ideal", "cpu_s_per_attempt", "rss_per_attempt_mib", "peak_threads",
        "messages_per_s", "cancel_p50_s", "cancel_p99_s", "leaks")


def test_a_small_load_run_ends_every_job_leaks_nothing_and_prints_its_figures(tmp_path: Path, bench_cwd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load.py"), "--attempts", "12", "--job-seconds", "0.5",
         "--scale", "100", "--dir", str(tmp_path), "--view"],
        capture_output=True, text=True, timeout=300, check=False, cwd=bench_cwd,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert "wall / ideal" in proc.stdout  # the human table comes first
    result = json.loads(lines[-1])
    assert all(k in result for k in KEYS), [k for k in KEYS if k not in result]
    assert result["attempts"] == 12
    assert (result["jobs_ended"], result["outcomes"]) == (12, {"succeeded": 12})
    assert result["leaks"] == 0, {k: result[k] for k in ("leaked_machines", "leaked_actors", "leaked_threads")}
    assert result["cancel_machines_at_cancel"] == result["cancel_machines_gone"] == 12
    assert result["wall_over_ideal"] >= 1.0  # nothing finishes before its own critical path
    assert result["peak_threads"] >= 3  # the reactor, the ledger's writer, a pool worker at least
    assert result["rss_per_attempt_mib"] > 0
    # --view: the live view drew into its pseudo-terminal, at most 4 times a second, and its CPU is counted
    assert 0 < result["view_redraws"] <= 4 * result["wall_s"] + 1
    assert 0 < result["view_cpu_s"] < result["cpu_s"]
    assert result["view_events"] >= 12 * 5  # every job's lifecycle passed through it
    assert result["view_bytes"] > 0
    assert list(tmp_path.iterdir()) == []  # the run's folders are gone with it
