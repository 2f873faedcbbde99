"""supervisors/gc_tuning.py, in a process of its own (the setting is process-wide, and this test
process must keep Python's)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, json
from actor_run.supervisors.gc_tuning import THRESHOLDS, tune_gc
before = gc.get_freeze_count()
tune_gc()
cycle = []
cycle.append(cycle)  # a cycle made after the freeze is still collected
del cycle
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(), "thresholds": gc.get_threshold(),
                  "expected": THRESHOLDS, "collected": gc.collect()}))
"""


def test_tune_gc_freezes_what_exists_and_raises_the_thresholds_but_cycles_are_still_collected() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60,
                         check=True, cwd=ROOT)
    got = json.loads(out.stdout)
    assert got["before"] == 0
    assert got["frozen"] > 1000  # the modules and classes imported so far
    assert got["thresholds"] == got["expected"] == [10_000, 20, 20]
    assert got["collected"] >= 1
    assert gc.get_freeze_count() == 0  # this process untouched
