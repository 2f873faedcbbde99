"""supervisors/cli/cancel.py: `actor-run cancel` from another terminal (issue 29.3), through the
real command line: the owning controller (SQLite, or a worker on PostgreSQL) stops the attempt,
deletes the machine and records `canceled`; a dead controller's jobs are ended and their machines
deleted as the sweep would."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from support.cli_inproc import CLI, run_cli
from support.waits import poll

from actor_run.supervisors.ledger import LedgerReader

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}

# each seed holds until the test opens the gate (bounded: 120 s), then succeeds
BATCH = """\
[job]
name = "t"
command = "sh -c 'for i in $(seq 1 1200); do [ -e \\"$GATE\\" ] && exit 0; sleep 0.1; done; exit 3'"
seeds = [1, 2]
env = {{ GATE = "{gate}" }}
public_env = ["GATE"]  # a worker on a shared ledger reads it back from there

[policy]
poll_s = 0.1
max_attempts = 1
"""



def read(ledger: str | Path, what: str) -> list[Any]:
    reader = LedgerReader(ledger)
    try:
        return list(reader.jobs() if what == "jobs" else reader.machines())
    finally:
        reader.close()


def running_machines(ledger: str | Path) -> list[tuple[str, str, int]]:
    """(state, phase, seed) of each machine, read with a connection of the test's own and named
    columns (a controller may still be adding columns to its new tables)."""
    sql = "SELECT state, phase, seed FROM machines"
    if isinstance(ledger, Path):
        if not ledger.exists():
            return []
        conn = sqlite3.connect(ledger)
        try:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
        except sqlite3.OperationalError:  # no table yet
            return []
        finally:
            conn.close()
    with psycopg.connect(ledger) as pg:
        try:
            return [tuple(r) for r in pg.execute(sql).fetchall()]
        except psycopg.errors.UndefinedTable:  # the controller has not made the tables yet
            return []


def both_running(ledger: str | Path) -> Callable[[], list[Any]]:
    def check() -> list[Any]:
        rows = [m for m in running_machines(ledger) if m[0] == "alive" and m[1] == "running"]
        return rows if len(rows) == 2 else []

    return check


def start(tmp: Path, ledger: str | Path) -> tuple[subprocess.Popen[str], Path]:
    gate = tmp / "gate"
    path = tmp / "b.toml"
    path.write_text(BATCH.format(gate=gate))
    proc = subprocess.Popen([*CLI, "run", str(path), "--ledger", str(ledger), "--state-dir", str(tmp / "state"),
                             "--out", str(tmp / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    return proc, gate


def cancel(tmp: Path, ledger: str | Path, *target: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["cancel", *target, "--ledger", str(ledger), "--state-dir", str(tmp / "state")],
                          timeout=180, env=ENV)


def test_cancel_one_seed_from_another_terminal(tmp_path: Path, ledger_location: str | Path) -> None:
    proc, gate = start(tmp_path, ledger_location)
    try:
        poll(both_running(ledger_location), 90, "both seeds running")
        done = cancel(tmp_path, ledger_location, "t/1")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "t/seed-1 (run " in done.stdout
        assert "canceled" in done.stdout
        jobs = {j["key"]: j for j in read(ledger_location, "jobs")}
        assert (jobs["t/seed-1"]["state"], jobs["t/seed-1"]["failure"]) == ("failed", "canceled")
        assert jobs["t/seed-2"]["state"] == "running"  # the other seed goes on
        machines = {m.seed: m for m in read(ledger_location, "machines")}
        assert machines[1].state == "deleted"
        assert machines[2].state == "alive"
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, out + err  # one job canceled, none failed: its own exit code
    said = out + err
    assert f"controller pid {proc.pid}" in said
    assert "actor-run cancel " in said
    jobs = {j["key"]: j for j in read(ledger_location, "jobs")}
    assert jobs["t/seed-2"]["state"] == "succeeded"
    assert jobs["t/seed-1"]["failure"] == "canceled"


def test_cancel_of_a_dead_controllers_run_deletes_its_machines(tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite"
    proc, _ = start(tmp_path, ledger)
    try:
        poll(both_running(ledger), 90, "both seeds running")
        run = read(ledger, "jobs")[0]["run"]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    done = cancel(tmp_path, ledger, run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 machine(s) of dead controller(s) deleted" in done.stdout
    jobs = read(ledger, "jobs")
    assert {(j["state"], j["failure"]) for j in jobs} == {("failed", "canceled")}
    assert {m.state for m in read(ledger, "machines")} == {"deleted"}
    again = cancel(tmp_path, ledger, run)
    assert again.returncode == 1
    assert "nothing to cancel" in again.stdout


def test_cancel_of_nothing_known_is_one_line(tmp_path: Path) -> None:
    LedgerReader(tmp_path / "l.sqlite").close()  # a ledger without the run (a missing one is exit 2 as well)
    done = cancel(tmp_path, tmp_path / "l.sqlite", "nosuch/3")
    assert done.returncode == 2
    assert done.stderr.strip() == "actor-run: cancel: no run, job or job/seed 'nosuch/3' in the ledger"


def test_cancel_of_a_queued_seed_ends_it_without_a_machine_and_the_others_go_on(
        tmp_path: Path, ledger_location: str | Path) -> None:
    """One seed at a time: seed 1 holds the only slot, seeds 2 and 3 wait (queued in a shared
    ledger's queue, or in the controller's own). Seed 2 is canceled before it ever starts."""
    gate = tmp_path / "gate"
    path = tmp_path / "b.toml"
    path.write_text(BATCH.format(gate=gate).replace("seeds = [1, 2]", "seeds = [1, 2, 3]")
                    + "concurrency = 1\n")
    proc = subprocess.Popen([*CLI, "run", str(path), "--ledger", str(ledger_location), "--poll", "0.2", "--state-dir",
                             str(tmp_path / "state"), "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        poll(lambda: [m for m in running_machines(ledger_location) if m[:2] == ("alive", "running")], 90,
             "the first seed running")
        assert [m[2] for m in running_machines(ledger_location)] == [1]  # the others wait for the slot
        done = cancel(tmp_path, ledger_location, "t/2")
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"^t/seed-2 \(run \w+\): canceled", done.stdout, re.M), done.stdout
        jobs = {j["key"]: j for j in read(ledger_location, "jobs")}
        assert (jobs["t/seed-2"]["state"], jobs["t/seed-2"]["failure"]) == ("failed", "canceled")
        gate.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, out + err  # one job canceled, the others succeeded
    jobs = {j["key"]: j for j in read(ledger_location, "jobs")}
    assert {k: (j["state"], j["failure"]) for k, j in jobs.items()} == {
        "t/seed-1": ("succeeded", None), "t/seed-2": ("failed", "canceled"), "t/seed-3": ("succeeded", None)}
    assert sorted(m.seed for m in read(ledger_location, "machines")) == [1, 3]  # seed 2 never leased one
