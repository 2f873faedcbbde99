"""Prefect 3 itself embeds the Runner: a flow whose task opens a Runner on the local cloud and runs
a one-seed job, in Prefect's own interpreter (its venv: scripts/test.sh makes `.venv-prefect`, or
$ACTOR_RUN_PREFECT_PYTHON names one), against Prefect's ephemeral server. The process must exit 0:
with trio-asyncio imported (its process-wide asyncio patch), every such process crashed with
SIGSEGV at exit after its flow had completed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIN = "3.9.1"  # scripts/test.sh's PREFECT_PIN

FLOW = r"""
import json, sys
from pathlib import Path

from prefect import flow, task

import actor_run

out = Path(sys.argv[1])


@task
def one_seed() -> dict:
    job = actor_run.Job(name="from-prefect", seed=1, command="echo done > \"$ACTOR_RUN_OUT/note.txt\"")
    with actor_run.Runner(out_dir=out / "out", state_dir=out / "state", sweep_on_start=False) as runner:
        ended = runner.submit(job).result(180)
    return {"outcome": ended.outcome, "out_dir": ended.out_dir}


@flow
def embedded() -> dict:
    return one_seed()


print("RESULT " + json.dumps(embedded()))
"""


def prefect_python() -> str:
    python = os.environ.get("ACTOR_RUN_PREFECT_PYTHON") or str(ROOT / ".venv-prefect" / "bin" / "python")
    if not Path(python).exists():
        pytest.fail(f"Prefect's venv is missing ({python}): scripts/test.sh makes it (prefect=={PIN})")
    return python


def test_a_prefect_flow_runs_a_job_and_its_process_exits_0(tmp_path: Path) -> None:
    python = prefect_python()
    version = subprocess.run([python, "-c", "import prefect; print(prefect.__version__)"],
                             capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    assert version == PIN
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({
        "PREFECT_HOME": str(tmp_path / "prefect-home"),  # its database and settings: this test's own
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",  # 2 busy cores start it slowly
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_TO_API_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": str(ROOT),  # this repository, as the suite imports it
    })
    done = subprocess.run([python, "-c", FLOW, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["outcome"] == "succeeded"
    assert (Path(result["out_dir"]) / "out" / "note.txt").read_text() == "done\n"


def test_the_test_command_makes_prefects_venv_pinned() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert f'PREFECT_PIN="prefect=={PIN}"' in script
    assert "ACTOR_RUN_PREFECT_PYTHON" in script
    assert sys.executable  # the suite's own interpreter is not Prefect's
