"""supervisors/api/gc_tuning.py: `tune_gc` in a process of its own (it freezes, which this test process
must not); the Runner's `hold`/`let_go` here, each test putting Python's thresholds back."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from actor_run.supervisors.api.gc_tuning import PYTHONS, THRESHOLDS
from actor_run.supervisors.api.runner import Runner

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import gc, json
from actor_run.supervisors.api.gc_tuning import THRESHOLDS, tune_gc
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
    assert got["thresholds"] == got["expected"] == [50_000, 20, 20]
    assert got["collected"] >= 1
    assert gc.get_freeze_count() == 0  # this process untouched


ENTRY = """
import gc, json, sys
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
from actor_run.supervisors.cli import entry
sys.argv = ["actor-run", "--version"]
try:
    entry()
except SystemExit as exc:
    sys.stderr.write(json.dumps({"code": exc.code, "full": len(full), "frozen": gc.get_freeze_count(),
                                 "thresholds": gc.get_threshold()}) + "\\n")
"""


def test_the_cli_freezes_its_imports_without_a_full_collection_first() -> None:
    """Issue 24: the full collection at the CLI's start walked every object for about 10 ms of CPU
    in every `actor-run` process and found nothing to free; the CLI freezes without it."""
    out = subprocess.run([sys.executable, "-c", ENTRY], capture_output=True, text=True, timeout=60, check=True,
                         cwd=ROOT)
    got = json.loads(out.stderr.splitlines()[-1])
    assert out.stdout.startswith("actor-run ")
    assert got["code"] == 0
    assert got["frozen"] > 1000  # the command line's modules
    assert got["thresholds"] == [50_000, 20, 20]
    assert got["full"] == 0  # no generation-2 collection from the start to the exit


def test_tune_gc_without_collect_freezes_garbage_that_exists_then() -> None:
    """The price of collect=False, said in its docstring: a cycle already garbage is frozen, not freed."""
    script = ("import gc, json\nfrom actor_run.supervisors.api.gc_tuning import tune_gc\n"
              "gc.collect()\ncycle = []\ncycle.append(cycle)\ndel cycle\n"
              "tune_gc(collect=False)\nprint(json.dumps(gc.collect()))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                         cwd=ROOT)
    assert json.loads(out.stdout) == 0


def _runner(tmp_path: Path, name: str, **kw: object) -> Runner:
    return Runner(out_dir=tmp_path / name / "out", state_dir=tmp_path / name, sweep_on_start=False, **kw)  # type: ignore[arg-type]


def test_an_open_runner_raises_the_thresholds_and_the_last_to_close_puts_pythons_back(tmp_path: Path) -> None:
    assert gc.get_threshold() == PYTHONS
    try:
        with _runner(tmp_path, "a"):
            assert gc.get_threshold() == THRESHOLDS
            with _runner(tmp_path, "b"):
                assert gc.get_threshold() == THRESHOLDS
            assert gc.get_threshold() == THRESHOLDS  # "a" is still open
        assert gc.get_threshold() == PYTHONS
        assert gc.get_freeze_count() == 0  # the Runner never freezes the host's objects
    finally:
        gc.set_threshold(*PYTHONS)


def test_tune_gc_false_and_a_hosts_own_thresholds_are_left_alone(tmp_path: Path) -> None:
    try:
        with _runner(tmp_path, "a", tune_gc=False):
            assert gc.get_threshold() == PYTHONS
        gc.set_threshold(2000, 10, 10)  # the host's choice
        with _runner(tmp_path, "b"):
            assert gc.get_threshold() == (2000, 10, 10)
        assert gc.get_threshold() == (2000, 10, 10)
    finally:
        gc.set_threshold(*PYTHONS)
