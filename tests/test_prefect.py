"""Prefect 3 itself embeds the Runner: a flow whose task opens a Runner on the local cloud and runs
a one-seed job, in Prefect's own interpreter (its venv: scripts/test.sh makes `.venv-prefect`, or
$ACTOR_RUN_PREFECT_PYTHON names one), against Prefect's ephemeral server. The process must exit 0:
with trio-asyncio imported (its process-wide asyncio patch), every such process crashed with
SIGSEGV at exit after its flow had completed.

The ephemeral server (a `uvicorn` process the flow's client starts) spent about 14 s of CPU running
Prefect's ~200 database migrations on its new SQLite file and about 4 s registering its block types,
each time. It starts here on a copy of a database Prefect made the same way once per venv
(prepared_database: its own migrations and block registration, the calls its server's start makes),
told not to do either again; the flow's process reports the version (no second interpreter)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIN = "3.9.1"  # scripts/test.sh's PREFECT_PIN

FLOW = r"""
import json, sys
from pathlib import Path

import prefect
from prefect import flow, task

print("VERSION " + prefect.__version__, flush=True)

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


# what the ephemeral server's start does to a new database (prefect/server/api/server.py create_app's
# run_migrations and add_block_types), done once: the test's server starts on a copy of the result
PREPARE = r"""
import asyncio

import prefect
from prefect.server.database import provide_database_interface
from prefect.server.models.block_registration import run_block_auto_registration


async def prepare() -> None:
    db = provide_database_interface()
    await db.create_db()
    session = await db.session()
    async with session:
        await run_block_auto_registration(session=session)


asyncio.run(prepare())
print(prefect.__version__)
"""


def prefect_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({
        "PREFECT_HOME": str(home),  # its database and settings: this test's own
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",  # 2 busy cores start it slowly
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_TO_API_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": str(ROOT),  # this repository, as the suite imports it
    })
    return env


def prepared_database(python: str) -> Path:
    """Prefect's database as its server's start leaves a new one (migrated to its head, its block types
    registered), made by PREPARE in Prefect's venv the first time a venv runs this test (about 20 s of
    CPU, what every run of the test spent before) and kept beside the venv's bin/ under the pin's name."""
    venv = Path(python).parent.parent
    kept = venv / f"actor-run-test-prefect-{PIN}.db"
    if kept.exists():
        return kept
    with tempfile.TemporaryDirectory(dir=venv, prefix="actor-run-test-prefect-") as work:
        done = subprocess.run([python, "-c", PREPARE], capture_output=True, text=True, timeout=600, cwd=work,
                              env=prefect_env(Path(work)))
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
        assert done.stdout.split()[-1] == PIN
        with sqlite3.connect(Path(work) / "prefect.db") as made:  # one file (its WAL folded in), then in place
            made.execute("VACUUM INTO ?", (str(Path(work) / "copy.db"),))
        made.close()
        os.replace(Path(work) / "copy.db", kept)
    return kept


def test_a_prefect_flow_runs_a_job_and_its_process_exits_0(tmp_path: Path) -> None:
    python = prefect_python()
    home = tmp_path / "prefect-home"
    home.mkdir()
    shutil.copyfile(prepared_database(python), home / "prefect.db")
    env = prefect_env(home)
    env.update({
        "PREFECT_API_DATABASE_MIGRATE_ON_START": "false",  # prepared_database ran them
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",  # and registered them
    })
    done = subprocess.run([python, "-c", FLOW, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    versions = [x.removeprefix("VERSION ") for x in done.stdout.splitlines() if x.startswith("VERSION ")]
    assert versions == [PIN]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["outcome"] == "succeeded"
    assert (Path(result["out_dir"]) / "out" / "note.txt").read_text() == "done\n"


def test_the_test_command_makes_prefects_venv_pinned() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert f'PREFECT_PIN="prefect=={PIN}"' in script
    assert "ACTOR_RUN_PREFECT_PYTHON" in script
    assert sys.executable  # the suite's own interpreter is not Prefect's
