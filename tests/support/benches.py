"""A bench run by a test as a user runs it (tests/bench/)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python bench/SCRIPT ARGS` as a user runs it, its output captured. Past `timeout` it gets
    SIGTERM first, on which a bench stops what it started (its workers, its PostgreSQL server:
    subprocess.run's SIGKILL left them running), and the test fails with what it printed."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"bench/{script} ran past {timeout} s:\n{out[-2000:]}{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

