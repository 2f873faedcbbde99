"""A team budget too full for a job (issue 47): with `on_budget_full = "wait"` (the default) the
job waits for room, said in `--json` and in `status --json`, and starts once a reservation is
released (at once when its own run released it; at its next ask when another run did); with
"end" it ends `budget` at once; a wait that runs out (`capacity_wait_s`) ends `budget` saying it
waited; SIGTERM ends a waiting run at once. The user config's `budget` is the default a batch's own
overrides (`budget = ""`: none), a worker's for queued jobs that name none; a budget the ledger lacks
is exit 2 before anything is rented.

Real parts: `actor-run` processes, a real PostgreSQL server (tests/support/pg.py), the sim cloud.
Every job's reservation is 120 $/h x (60 s + 30 s) = $3; the team budget of $4 holds one at a time.
A job holds its machine until the test creates its gate file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_inproc import run_cli
from support.waits import poll

from actor_run.supervisors.ledger import Ledger, LedgerReader
from actor_run.supervisors.ledger.db import close_pools

CLI = [sys.executable, "-m", "actor_run"]


@pytest.fixture
def url(postgres: Any) -> Iterator[str]:
    location = postgres.create_database()
    Ledger(location, "0" * 32).close()  # the ledger, at this version
    yield location
    close_pools()


def batch(tmp: Path, name: str, *, seeds: int = 1, gate: Path | None = None, policy: str = "") -> Path:
    """A sim batch whose jobs hold their machine until `gate` exists (none: they end at once)."""
    command = f"while [ ! -e {gate} ]; do sleep 0.05; done" if gate is not None else "true"
    path = tmp / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""\
        [job]
        name = "{name}"
        command = "{command}"
        seeds = {list(range(1, seeds + 1))}
        timeout_s = 60

        [policy]
        max_attempts = 1
        concurrency = {seeds}
        poll_s = 0.2
        setup_grace_s = 30
        last_grace_factor = 1.0
        """) + textwrap.dedent(policy) + textwrap.dedent("""
        [[candidates]]
        cloud = "sim"
        gpu = "A100"

        [clouds.sim]
        launch_latency_s = 0.01
        delete_latency_s = 0.0
        regions = [{ name = "us-east", gpus = { A100 = { stock = 16, hourly_usd = 120.0 } } }]
        """))
    return path


class Run:
    """`actor-run run BATCH --json` in the background; its events read as they come."""

    def __init__(self, tmp: Path, env: dict[str, str], path: Path) -> None:
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen([*CLI, "run", str(path), "--state-dir", str(tmp / "state"), "--out",
                                      str(tmp / "out"), "--yes", "--json"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.stderr = ""
        self._errors: list[str] = []
        # one reader per pipe, each a thread of its own (a `communicate` beside a reader of stdout would
        # take some of its lines: two readers of one pipe)
        self._reader = threading.Thread(target=self._read, name="test-team-wait-events")
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_errors, name="test-team-wait-stderr")
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        self._errors.extend(self.proc.stderr)

    def of(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e["type"] == kind and all(e.get(k) == v for k, v in fields.items())]

    def wait_for(self, kind: str, timeout: float = 120, **fields: Any) -> dict[str, Any]:
        return poll(lambda: (self.of(kind, **fields) or [None])[0], timeout, f"{kind} {fields}")

    def finish(self, timeout: float = 180) -> int:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(30)
            self._err_reader.join(30)
            self.stderr = "".join(self._errors)
        return self.proc.returncode


def cli(env: dict[str, str], tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A one-shot command (support/cli_inproc.py: in this process, as a child would run it)."""
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=120, env=env)


def set_budget(env: dict[str, str], tmp: Path, name: str, usd: float) -> None:
    done = cli(env, tmp, "budget", "set", name, "--usd", str(usd), "--per", "total")
    assert done.returncode == 0, done.stderr


def reservations(url: str) -> list[dict[str, Any]]:
    reader = LedgerReader(url)
    try:
        return list(reader.reservations())
    finally:
        reader.close()


@pytest.fixture
def env(tmp_path: Path, url: str) -> dict[str, str]:
    (tmp_path / "state").mkdir()
    return {**{k: v for k, v in os.environ.items() if k != "ACTOR_RUN_CONFIG"}, "ACTOR_RUN_LEDGER": url,
            "ACTOR_RUN_CONFIG": str(tmp_path / "config.toml")}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text("")
    return path


def test_a_job_waits_for_room_and_starts_when_its_own_run_releases_some(
        tmp_path: Path, env: dict[str, str], config: Path) -> None:
    """Two seeds of one run, room for one: the second waits (`--json`, `status --json` say for which
    budget) and starts as soon as the first's release is committed, not at its next ask."""
    set_budget(env, tmp_path, "team-a", 4.0)
    gate = tmp_path / "gate"
    run = Run(tmp_path, env, batch(tmp_path, "pair", seeds=2, gate=gate, policy='budget = "team-a"\n'))
    try:
        waiting = run.wait_for("WaitingForCapacity", budget="team-a")
        first = run.of("Reserved")
        assert [e["seed"] for e in first] == [3 - waiting["seed"]]  # the other one holds the $3
        shown = cli(env, tmp_path, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        jobs = {d["key"]: d for d in map(json.loads, shown.stdout.splitlines()) if d["kind"] == "job"}
        job = jobs[f"pair/seed-{waiting['seed']}"]
        assert (job["now"], job["stage"]) == ("waiting", "waiting for team budget 'team-a'"), job
        # its asks back off (0.5 s doubling): past 8 s of waiting the next is at 15.5 s
        poll(lambda: time.time() - waiting["t"] >= 8.0, 60, "eight seconds of waiting")
        gate.touch()
        later = run.wait_for("Reserved", seed=waiting["seed"])
        released = run.wait_for("Charged", seed=3 - waiting["seed"])
    finally:
        gate.touch()
        code = run.finish()
    assert code == 0, run.stderr[-3000:]
    assert later["t"] >= released["t"]
    assert later["t"] - released["t"] < 4.0, (later, released)  # woken by the release, not by the backoff
    assert sorted(e["outcome"] for e in run.of("JobEnded")) == ["succeeded", "succeeded"]


def test_two_runs_on_one_budget_take_turns_with_wait(tmp_path: Path, env: dict[str, str], config: Path) -> None:
    """The second run's job starts only after the first run's job ended (its asks again find the
    room another run freed), and both succeed."""
    set_budget(env, tmp_path, "team-a", 4.0)
    gate = tmp_path / "gate"
    first = Run(tmp_path, env, batch(tmp_path, "first", gate=gate, policy='budget = "team-a"\n'))
    second: Run | None = None
    try:
        first.wait_for("Reserved")
        second = Run(tmp_path, env, batch(tmp_path, "second", gate=gate, policy='budget = "team-a"\n'))
        second.wait_for("WaitingForCapacity", budget="team-a")
        assert second.of("Reserved") == []
        gate.touch()
        assert first.finish() == 0, first.stderr[-3000:]
        assert second.finish() == 0, second.stderr[-3000:]
    finally:
        gate.touch()
        first.finish()
        if second is not None:
            second.finish()
    assert second is not None
    assert [e["outcome"] for e in first.of("JobEnded") + second.of("JobEnded")] == ["succeeded", "succeeded"]
    assert second.wait_for("Reserved")["t"] >= first.wait_for("Charged")["t"]
    rows = sorted(reservations(env["ACTOR_RUN_LEDGER"]), key=lambda r: r["reserved_at"])
    assert [r["budget"] for r in rows] == ["team-a", "team-a"]
    assert rows[1]["reserved_at"] >= rows[0]["released_at"]  # never both held at once


def test_end_ends_at_once_a_run_out_wait_says_it_waited_and_sigterm_ends_a_wait(
        tmp_path: Path, env: dict[str, str], config: Path) -> None:
    """While one run holds the budget: "end" ends `budget` at once; "wait" with capacity_wait_s = 2
    ends `budget` after 2 s saying it waited; a waiting run's SIGTERM ends it (exit 130), renting nothing."""
    set_budget(env, tmp_path, "team-a", 4.0)
    gate = tmp_path / "gate"
    holder = Run(tmp_path, env, batch(tmp_path, "holder", gate=gate, policy='budget = "team-a"\n'))
    others: list[Run] = []
    try:
        holder.wait_for("Reserved")
        ender = Run(tmp_path, env, batch(tmp_path, "ender", policy='budget = "team-a"\non_budget_full = "end"\n'))
        waiter = Run(tmp_path, env, batch(tmp_path, "waiter", policy='budget = "team-a"\ncapacity_wait_s = 2\n'))
        stopped = Run(tmp_path, env, batch(tmp_path, "stopped", policy='budget = "team-a"\n'))
        others = [ender, waiter, stopped]
        assert ender.finish() == 1, ender.stderr[-3000:]
        assert waiter.finish() == 1, waiter.stderr[-3000:]
        stopped.wait_for("WaitingForCapacity", budget="team-a")
        stopped.proc.send_signal(signal.SIGTERM)
        assert stopped.finish(timeout=60) == 130, stopped.stderr[-3000:]
    finally:
        gate.touch()
        for r in [holder, *others]:
            r.finish()
    assert holder.proc.returncode == 0, holder.stderr[-3000:]
    (ended,) = ender.of("JobEnded")
    assert ended["failure"] == "budget"
    assert ended["detail"].count("team budget 'team-a' has $1.00 left of $4.00") == 1, ended  # said once
    assert ender.of("WaitingForCapacity") == []
    # each run ran its own job only (a run on a shared ledger works on its own batch), every line
    # naming it
    for r in (ender, waiter, stopped):
        assert {(e["run"], e["job"]) for e in r.events} == {(r.events[0]["run"], r.events[0]["job"])}, r.events
    (ended,) = waiter.of("JobEnded")
    assert ended["failure"] == "budget"
    assert "no room in the team budget 'team-a' (waited 2 s)" in ended["detail"], ended
    assert ended["detail"].count("has $1.00 left of $4.00") == 1, ended
    assert [e["budget"] for e in waiter.of("WaitingForCapacity")] == ["team-a"]
    (ended,) = stopped.of("JobEnded")
    assert ended["failure"] == "canceled", ended
    for r in others:
        assert r.of("LeaseRequested") == []  # nothing rented while the budget was full
    assert {r["job"] for r in reservations(env["ACTOR_RUN_LEDGER"]) if r["state"] == "live"} == set()


def test_the_user_configs_budget_is_the_default_and_a_missing_one_is_exit_2(
        tmp_path: Path, env: dict[str, str], config: Path) -> None:
    """`budget = "team-a"` in the user config: a batch naming none draws on it, a batch's own
    `budget` wins, `budget = ""` draws on none. A budget the ledger lacks (the config's or a batch's)
    is one line naming it and its field, exit 2, with no job recorded."""
    set_budget(env, tmp_path, "team-a", 100.0)
    set_budget(env, tmp_path, "team-b", 100.0)
    config.write_text('budget = "team-a"\n')
    for name, policy in (("plain", ""), ("own", 'budget = "team-b"\n'), ("none", 'budget = ""\n')):
        done = cli(env, tmp_path, "run", str(batch(tmp_path, name, policy=policy)), "--out", str(tmp_path / "out"),
                   "--yes", "--json")
        assert done.returncode == 0, done.stderr[-3000:]
    by_job = {r["job"]: r["budget"] for r in reservations(env["ACTOR_RUN_LEDGER"])}
    assert by_job == {"plain/seed-1": "team-a", "own/seed-1": "team-b", "none/seed-1": None}
    config.write_text('budget = "nobody"\n')
    missing = cli(env, tmp_path, "run", str(batch(tmp_path, "lost")), "--out", str(tmp_path / "out"), "--yes")
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.count("\n") == 1, missing.stderr
    assert "budget (in user config" in missing.stderr
    assert "no team budget 'nobody'" in missing.stderr
    missing = cli(env, tmp_path, "run", str(batch(tmp_path, "lost", policy='budget = "ghost"\n')), "--out",
                  str(tmp_path / "out"), "--yes")
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.count("\n") == 1, missing.stderr
    assert "policy.budget: no team budget 'ghost'" in missing.stderr
    reader = LedgerReader(env["ACTOR_RUN_LEDGER"])
    try:
        assert not [r for r in reader.runs() if r.batch and "lost" in r.batch]
        assert "lost/seed-1" not in {j["key"] for r in reader.runs() for j in reader.jobs(r.id)}
    finally:
        reader.close()
    config.write_text('budget = "bad name"\n')
    bad = cli(env, tmp_path, "run", str(batch(tmp_path, "lost")), "--out", str(tmp_path / "out"), "--yes")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.startswith("actor-run: budget: expected a team budget's name"), bad.stderr


def test_a_worker_gives_its_settings_budget_to_the_queued_jobs_that_name_none(
        tmp_path: Path, env: dict[str, str], config: Path) -> None:
    """Jobs queued with `--submit-only`, run by a worker whose settings say `budget = "team-w"`: a
    job whose batch and submitter named none draws on the worker's; a batch's own budget, a batch's
    `budget = ""` and a submitter's settings' budget (recorded with the job when it was queued) win.
    A worker whose settings name a budget the ledger lacks is one line, exit 2, and claims nothing."""
    for name in ("team-s", "team-b", "team-w"):
        set_budget(env, tmp_path, name, 100.0)
    queued = [("plain", ""), ("own", 'budget = "team-b"\n'), ("none", 'budget = ""\n')]
    for name, policy in queued:
        done = cli(env, tmp_path, "run", str(batch(tmp_path, name, policy=policy)), "--out", str(tmp_path / "out"),
                   "--yes", "--submit-only")
        assert done.returncode == 0, done.stderr[-3000:]
    config.write_text('budget = "team-s"\n')  # this submitter's settings name one: the queued job keeps it
    done = cli(env, tmp_path, "run", str(batch(tmp_path, "theirs")), "--out", str(tmp_path / "out"), "--yes",
               "--submit-only")
    assert done.returncode == 0, done.stderr[-3000:]

    worker_config = tmp_path / "worker.toml"
    worker_env = {**env, "ACTOR_RUN_CONFIG": str(worker_config)}
    worker_config.write_text('budget = "nobody"\n')
    lost = cli(worker_env, tmp_path, "worker", "--until-idle", "--poll", "0.5")
    assert lost.returncode == 2, lost.stderr[-3000:]
    assert lost.stderr.count("\n") == 1, lost.stderr
    assert f"budget (in user config {worker_config})" in lost.stderr, lost.stderr
    assert "no team budget 'nobody'" in lost.stderr, lost.stderr
    reader = LedgerReader(env["ACTOR_RUN_LEDGER"])
    try:
        assert set(reader.job_states().values()) == {"queued"}  # nothing claimed
    finally:
        reader.close()

    worker_config.write_text('budget = "team-w"\n')
    worked = cli(worker_env, tmp_path, "worker", "--until-idle", "--poll", "0.5")
    assert worked.returncode == 0, worked.stderr[-3000:]
    by_job = {r["job"]: r["budget"] for r in reservations(env["ACTOR_RUN_LEDGER"])}
    assert by_job == {"plain/seed-1": "team-w", "own/seed-1": "team-b", "none/seed-1": None,
                      "theirs/seed-1": "team-s"}
