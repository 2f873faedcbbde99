"""Many controllers, one PostgreSQL ledger (supervisors/cli/worker.py): real `actor-run` processes
on a real PostgreSQL server (tests/support/pg.py) share one batch on the sim cloud and one state folder.

The job holds an exclusive lock per seed while it runs: a second copy of a seed running at the
same time fails to take it and writes OVERLAP to the trace (tests/support/controller_kit.py's job)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.keys import client_key
from support.cli_inproc import CLI, run_cli
from support.controller_kit import release, trace_lines, wait_no_processes, write_batch
from support.waits import poll

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.ledger.db import close_pools

LEASE_S, POLL_S = 6.0, 0.5  # adoption bound: the lease plus one poll


@pytest.fixture
def url(postgres: Any) -> Iterator[str]:
    yield postgres.create_database()
    close_pools()


class Controller:
    """One `actor-run worker` process (or, with `run`, the `actor-run run BATCH` that queued the
    batch and works on it too); its JSON events are read on a thread of the test's own."""

    def __init__(self, tmp: Path, url: str, name: str, *, concurrency: int = 2, run: Path | None = None,
                 lease: float = LEASE_S, extra: tuple[str, ...] = ()) -> None:
        self.name = name
        command = ["run", str(run)] if run is not None else ["worker", "--until-idle"]
        self.proc = subprocess.Popen(
            [*CLI, *command, "--ledger", url, "--concurrency", str(concurrency), "--json",
             "--lease", str(lease), "--poll", str(POLL_S), "--out", str(tmp / "out"), "--state-dir",
             str(tmp / "state"), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # a controller that hangs past `finish` says where
        self.events: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.events.append(json.loads(line))
                self.changed.notify_all()

    def wait_for(self, kind: str, count: int = 1, timeout: float = 60) -> None:
        with self.changed:
            ok = self.changed.wait_for(lambda: sum(e["type"] == kind for e in self.events) >= count, timeout)
        assert ok, f"{self.name}: no {count} {kind} within {timeout} s"

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # every thread's stack on stderr (faulthandler), then the failure says where it hung
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(30)
            assert self.proc.stderr is not None
            stacks = self.proc.stderr.read()[-20000:]
            raise AssertionError(f"{self.name} did not end within {timeout} s:\n{stacks}") from None
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        self.proc.stderr.close()
        return code


def cli(tmp: Path, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=timeout, cwd=tmp,
                   env={**os.environ, **(env or {})})


def jobs(url: str) -> dict[str, dict[str, Any]]:
    reader = LedgerReader(url)
    try:
        return {j["key"]: j for j in reader.jobs()}
    finally:
        reader.close()


def owner_of_running(url: str, controller: Controller) -> str:
    """The owner id of a controller: the owner of a job it started and the ledger has as running."""
    started = {f"{e['job']}/seed-{e['seed']}" for e in controller.events if e["type"] == "JobStarted"}
    rows = jobs(url)
    owners = {rows[k]["owner"] for k in started if rows[k]["state"] == "running"}
    assert len(owners) == 1, owners
    return owners.pop()


def wait_until_adopted(url: str, dead: str, timeout: float) -> float:
    """Seconds until no running job is the dead owner's any more."""
    start = time.monotonic()
    poll(lambda: not any(j["owner"] == dead and j["state"] == "running" for j in jobs(url).values()), timeout,
         "the dead owner's jobs to be adopted", every=0.1)
    return time.monotonic() - start


def check_every_job_ended_once(tmp: Path, url: str, seeds: int) -> None:
    rows = jobs(url)
    assert sorted(rows) == sorted(f"chaos/seed-{s}" for s in range(1, seeds + 1))
    assert {j["state"] for j in rows.values()} == {"succeeded"}, rows
    reader = LedgerReader(url)
    try:
        ended = [e["job"] for e in reader.events() if e["type"] == "JobEnded"]
        assert sorted(ended) == sorted(rows), ended  # each job's end recorded exactly once
        assert all(m.state == "deleted" for m in reader.machines())
    finally:
        reader.close()
    for s in range(1, seeds + 1):
        assert (tmp / "out" / "latest" / "chaos" / f"seed-{s}" / "out" / "done.txt").read_text() == str(s)
    lines = trace_lines(tmp)
    assert not [ln for ln in lines if ln.startswith("OVERLAP")], lines  # never two copies at once
    assert sorted({ln.split()[1] for ln in lines if ln.startswith("end")}) == sorted(str(s) for s in
                                                                                     range(1, seeds + 1))
    assert sim_machines(tmp / "sim") == []
    assert wait_no_processes(tmp / "sim") == []


def test_three_controllers_share_a_batch_and_adopt_the_jobs_of_one_killed(tmp_path: Path, url: str) -> None:
    """`actor-run run` queues the batch and works on it with two workers; one worker is killed -9
    mid-batch, the others adopt its jobs within the lease plus one poll."""
    seeds = 9
    batch = write_batch(tmp_path, seeds=seeds, latency=0.2, extra_sim="")
    # 5 s jobs, held until the test has seen the run still running after the adoption
    batch.write_text(batch.read_text().replace("env = { TRACE", 'env = { HOLD = "1", STEPS = "20", TRACE')
                     .replace('public_env = ["TRACE"]', 'public_env = ["HOLD", "STEPS", "TRACE"]'))
    first = Controller(tmp_path, url, "run", run=batch)
    first.wait_for("JobStarted")
    controllers = [first, *(Controller(tmp_path, url, name) for name in ("b", "c"))]
    victim = controllers[1]
    victim.wait_for("JobStarted", 2)
    dead = owner_of_running(url, victim)
    victim.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.finish()
    waited = wait_until_adopted(url, dead, timeout=LEASE_S + POLL_S + 30)
    listed = [json.loads(x) for x in cli(tmp_path, "runs", "--json", "--ledger", url).stdout.splitlines()]
    assert [(r["state"], r["jobs"]) for r in listed] == [("running", seeds)]  # one view, from any controller
    # measured from the kill: the lease ran out at most LEASE_S after its last renewal, and the
    # others look once a poll (plus what a poll's own claim and sweep take on a loaded machine)
    assert time.monotonic() - killed >= waited
    print(f"adopted {waited:.2f} s after the kill (bound {LEASE_S + POLL_S:.1f} s)")
    assert waited <= LEASE_S + POLL_S + 5.0, waited
    release(tmp_path)
    for c in (controllers[0], controllers[2]):
        assert c.finish() == 0, c.stderr
    check_every_job_ended_once(tmp_path, url, seeds)
    listed = [json.loads(x) for x in cli(tmp_path, "runs", "--json", "--ledger", url).stdout.splitlines()]
    assert [(r["state"], r["succeeded"]) for r in listed] == [("succeeded", seeds)]
    # the run's output has each of its jobs' ends once, whoever ran it (the workers' from the ledger),
    # every line naming the run, as every worker's lines do
    (run,) = [r["id"] for r in listed]
    assert sorted(e["seed"] for e in first.events if e["type"] == "JobEnded") == list(range(1, seeds + 1))
    assert {e["run"] for c in controllers for e in c.events} == {run}
    by_worker = {e["seed"] for e in controllers[2].events if e["type"] == "JobEnded"}
    assert by_worker, "the second worker ran none of the batch's jobs"
    assert by_worker <= {e["seed"] for e in first.events if e["type"] == "AttemptStarted"}  # its lines, read back
    cost = [json.loads(x) for x in cli(tmp_path, "cost", "--json", "--ledger", url).stdout.splitlines()]
    total = next(c for c in cost if c.get("group") == "total")
    assert total["attempts"] >= seeds  # every controller's attempts, in one bill
    assert total["spent_usd"] > 0
    follow = cli(tmp_path, "status", "--follow", env={"ACTOR_RUN_LEDGER": url})  # the ledger named by the env
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout.count("succeeded") == seeds


def test_a_frozen_controller_past_its_lease_writes_nothing_and_its_jobs_finish_under_the_adopter(
    tmp_path: Path, url: str,
) -> None:
    seeds = 4
    batch = write_batch(tmp_path, seeds=seeds, latency=0.2)
    batch.write_text(batch.read_text().replace("env = { TRACE", 'env = { STEPS = "20", TRACE')  # 5 s jobs
                     .replace('public_env = ["TRACE"]', 'public_env = ["STEPS", "TRACE"]'))
    queued = cli(tmp_path, "run", str(batch), "--ledger", url, "--submit-only", "--out", str(tmp_path / "out"))
    assert queued.returncode == 0, queued.stderr
    frozen = Controller(tmp_path, url, "frozen", concurrency=2)
    frozen.wait_for("JobStarted", 2)
    adopter = Controller(tmp_path, url, "adopter", concurrency=2)
    owner = owner_of_running(url, frozen)
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until_adopted(url, owner, timeout=LEASE_S + 60)

        def written() -> int:
            """What the frozen controller wrote: each event row carries its writer (a machine row of
            the frozen owner may still change after this: the adopter's sweep closes it)."""
            reader = LedgerReader(url)
            try:
                return sum(e["owner"] == owner for e in reader.events())
            finally:
                reader.close()

        before = written()
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    assert frozen.finish() == 0  # it found its lease expired, let its jobs go, joined again as a new owner
    assert "lease in the ledger expired" in frozen.stderr
    assert "joining again as a new worker" in frozen.stderr
    assert "Traceback" not in frozen.stderr
    let_go = [e for e in frozen.events if e["type"] == "Released" and not e["confirmed"]]
    ends = [(e["type"], e["seed"], e.get("attempt"), e.get("confirmed"), e.get("outcome"),
             str(e.get("detail", ""))[:80])
            for e in frozen.events if e["type"] in ("Exited", "Fetched", "Released", "AttemptEnded", "JobEnded")]
    assert len(let_go) == 2, f"{ends}\n{frozen.stderr[-3000:]}"  # its two machines, left to the adopter, not deleted
    assert all("left to the controller that took over its job" in e["detail"] for e in let_go)
    assert adopter.finish() == 0, adopter.stderr
    assert written() == before  # nothing from the frozen controller after its token went stale
    check_every_job_ended_once(tmp_path, url, seeds)


def sim_batch(tmp: Path, name: str, command: str, *, seeds: int = 1, job: str = "", policy: str = "",
              sim: str = "") -> Path:
    """`tmp/NAME.toml`: a batch of one job on the sim cloud (its machines under tmp/sim), polled every
    0.2 s; `job`, `policy` and `sim` add lines to those tables."""
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[job]
name = "{name}"
command = "{command}"
seeds = {list(range(1, seeds + 1))}
timeout_s = 120
{job}
[policy]
poll_s = 0.2
{policy}
[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.05
delete_latency_s = 0.0
state_dir = "{tmp / 'sim'}"
{sim}
""")
    return path


def gated_batch(tmp: Path, name: str, *, seeds: int, policy: str = "", sim: str = "") -> tuple[Path, Path]:
    """A sim batch of one attempt per seed whose jobs hold their machine until the gate file (the
    first of the two paths) exists; the batch file second."""
    gate = tmp / "gate"
    return gate, sim_batch(tmp, name, f"sh -c 'while [ ! -e {gate} ]; do sleep 0.1; done'", seeds=seeds,
                           policy="max_attempts = 1\n" + policy, sim=sim)


SECRET = "sh -c 'echo $API_TOKEN > $ACTOR_RUN_OUT/token.txt'"  # a job that writes its secret to its outputs
FROM_THE_BATCH = 'env = { API_TOKEN = "from-the-batch" }'


def test_a_worker_takes_secrets_from_its_own_environment_and_the_ledger_never_holds_them(
    tmp_path: Path, url: str,
) -> None:
    batch = sim_batch(tmp_path, "secret", SECRET, job=FROM_THE_BATCH)
    queued = cli(tmp_path, "run", str(batch), "--ledger", url, "--submit-only", "--out", str(tmp_path / "out"))
    assert queued.returncode == 0, queued.stderr
    worker = run_cli(
        ["worker", "--ledger", url, "--until-idle", "--poll", "0.2", "--out", str(tmp_path / "out"),
         "--state-dir", str(tmp_path / "state")], timeout=120, cwd=tmp_path,
        env={**os.environ, "API_TOKEN": "from-the-worker"})
    assert worker.returncode == 0, worker.stderr
    assert (tmp_path / "out" / "latest" / "secret" / "seed-1" / "out" / "token.txt").read_text().strip() == (
        "from-the-worker")
    import psycopg

    with psycopg.connect(url) as conn:
        for table in ("jobs", "events", "machines", "clouds", "attempts", "owners"):
            text = str(conn.execute(f"SELECT * FROM {table}").fetchall())
            assert "from-the-batch" not in text, table
            assert "from-the-worker" not in text, table
    assert sim_machines(tmp_path / "sim") == []


def test_a_run_works_on_its_own_batch_and_its_end_leaves_a_teammates_queued_job_alone(
    tmp_path: Path, url: str,
) -> None:
    """A teammate's batch queued before ours (--submit-only: the workers' to run): our `run`, free
    slots and all, claims none of it (a job it held at its end, or at its Ctrl-C, would be canceled and
    its machine deleted). It ends 0 with its own job, which has the batch's secret (this process read
    it; the ledger never had it); the teammate's is still queued, never attempted, and a worker then
    runs it."""
    teammate = sim_batch(tmp_path, "theirs", SECRET)
    ours = sim_batch(tmp_path, "ours", SECRET, job=FROM_THE_BATCH)
    queued = cli(tmp_path, "run", str(teammate), "--ledger", url, "--submit-only", "--out", str(tmp_path / "out"))
    assert queued.returncode == 0, queued.stderr
    mine = Controller(tmp_path, url, "ours", concurrency=4, run=ours)
    assert mine.finish() == 0, mine.stderr
    assert {e["job"] for e in mine.events} == {"ours"}, mine.events
    assert [e["outcome"] for e in mine.events if e["type"] == "JobEnded"] == ["succeeded"]
    assert (tmp_path / "out" / "latest" / "ours" / "seed-1" / "out" / "token.txt").read_text().strip() == (
        "from-the-batch")
    rows = jobs(url)
    assert (rows["theirs/seed-1"]["state"], rows["theirs/seed-1"]["attempts"]) == ("queued", 0), rows
    worker = Controller(tmp_path, url, "worker")
    assert worker.finish() == 0, worker.stderr
    assert jobs(url)["theirs/seed-1"]["state"] == "succeeded"
    assert sim_machines(tmp_path / "sim") == []


def test_a_runs_ctrl_c_stops_its_whole_batch_on_every_worker(tmp_path: Path, url: str) -> None:
    """Ctrl-C of `actor-run run` on a shared ledger stops its batch, as on SQLite: the job it runs is
    canceled here, the one a worker runs is canceled there (its machine deleted), the queued one ends
    before any worker claims it; exit 130. (It stopped only its own machine: the worker finished the
    other job and then ran the queued one.)"""
    gate, batch = gated_batch(tmp_path, "held", seeds=3)
    mine = Controller(tmp_path, url, "run", concurrency=1, run=batch)
    try:
        mine.wait_for("JobStarted")
        worker = Controller(tmp_path, url, "worker", concurrency=1)
        worker.wait_for("JobStarted")
        mine.proc.send_signal(signal.SIGINT)
        assert mine.finish() == 130, mine.stderr
        rows = jobs(url)
        assert {k: (j["state"], j["failure"]) for k, j in rows.items()} == {
            f"held/seed-{s}": ("failed", "canceled") for s in (1, 2, 3)}, rows
        assert worker.finish() == 0, worker.stderr  # --until-idle: nothing queued or running any more
    finally:
        gate.touch()
    assert len([e for e in worker.events if e["type"] == "JobStarted"]) == 1  # never the queued one
    assert "canceled" in mine.stderr
    assert sim_machines(tmp_path / "sim") == []


def test_a_batchs_budget_holds_across_the_workers_that_run_its_jobs(tmp_path: Path, url: str) -> None:
    """A batch's `budget_usd` on a shared ledger is the whole batch's, whoever runs its jobs: each
    reservation is made in a ledger transaction against what every worker reserved and spent for the
    run. Two seeds of $5 (120 $/h x (120 s + 30 s)), a $7.50 budget: the run and a worker each claim
    one; one rents, the other ends `budget` saying what the batch has left, renting nothing. (The
    budget was not kept at all: each Runner knew only its own, and a shared run's had none.)"""
    dear = 'regions = [{ name = "us-east", gpus = { A100 = { stock = 16, hourly_usd = 120.0 } } }]'
    gate, batch = gated_batch(tmp_path, "capped", seeds=2,
                              policy="budget_usd = 7.5\nsetup_grace_s = 30\nlast_grace_factor = 1.0", sim=dear)
    mine = Controller(tmp_path, url, "run", concurrency=1, run=batch)
    try:
        mine.wait_for("JobStarted")
        worker = Controller(tmp_path, url, "worker", concurrency=1)
        worker.wait_for("JobEnded")
        (refused,) = [e for c in (mine, worker) for e in c.events if e["type"] == "JobEnded"]
        assert refused["failure"] == "budget", refused
        assert "the batch has $2.50 left of its $7.50 budget_usd" in refused["detail"], refused
        assert [e for e in worker.events if e["type"] == "LeaseRequested"] == []
    finally:
        gate.touch()
    assert mine.finish() == 1, mine.stderr  # one job failed (budget)
    assert worker.finish() == 0, worker.stderr
    rows = jobs(url)
    assert sorted((j["state"], j["failure"]) for j in rows.values()) == [("failed", "budget"), ("succeeded", None)]
    reader = LedgerReader(url)
    try:
        held = reader.reservations()
    finally:
        reader.close()
    assert [r["usd"] for r in held] == [5.0], held
    assert sim_machines(tmp_path / "sim") == []


def test_a_worker_without_a_clouds_key_leaves_its_jobs_queued_and_runs_what_it_can(tmp_path: Path, url: str) -> None:
    """A teammate queues (--submit-only, RUNPOD_API_KEY in its environment) a job for RunPod and one
    for RunPod or the sim. A worker without the key puts the first back in the queue for a worker
    that has it (saying so once, however often it claims it again), runs the second on the sim, and
    with --until-idle exits once nothing else is left for it. (It exited 2 at the claim, leaving the
    job `running` under its closed owner.)"""
    runpod = f'''
[[candidates]]
cloud = "runpod"
gpu = "H100"

[clouds.runpod]
api_url = "http://127.0.0.1:9"
ssh_key = "{client_key(tmp_path / "keys")}"
'''
    only = sim_batch(tmp_path, "rp", "true")
    only.write_text(only.read_text().split("[[candidates]]")[0] + runpod)  # RunPod only: no sim candidate
    either = sim_batch(tmp_path, "either", "true")
    either.write_text(either.read_text().replace("[[candidates]]", runpod + "\n[[candidates]]", 1))
    for batch in (only, either):
        queued = cli(tmp_path, "run", str(batch), "--ledger", url, "--submit-only", "--out", str(tmp_path / "out"),
                     env={"RUNPOD_API_KEY": "the-teammates-key"})
        assert queued.returncode == 0, queued.stderr
    submitted = jobs(url)["rp/seed-1"]["updated"]
    worker = Controller(tmp_path, url, "worker")
    assert worker.finish() == 0, worker.stderr  # --until-idle: the job it cannot run waits for another, not it
    assert jobs(url)["either/seed-1"]["state"] == "succeeded"
    rp = jobs(url)["rp/seed-1"]
    assert (rp["state"], rp["attempts"]) == ("queued", 0), rp
    assert rp["updated"] > submitted  # claimed, and put back at the queue's end
    said = [line for line in worker.stderr.splitlines() if "left queued for another worker" in line]
    assert len(said) == 1, worker.stderr[-3000:]
    assert "rp/seed-1" in said[0]
    assert "RUNPOD_API_KEY" in said[0]
    assert {e["offer"]["cloud"] for e in worker.events if e["type"] == "AttemptStarted"} == {"sim"}
    assert "cannot be used by this controller" in worker.stderr  # the RunPod candidate of `either`, passed over


def test_bad_shared_ledger_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, field in ((["worker", "--ledger", "mysql://x/y"], "--ledger"),
                        (["worker", "--ledger", "postgresql://x/y", "--concurrency", "0"], "--concurrency"),
                        (["worker", "--ledger", "postgresql://x/y", "--lease", "0"], "--lease")):
        done = cli(tmp_path, *args)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1
        assert field in lines[0]
    helped = run_cli(["worker", "--help"], timeout=60)
    assert "example: actor-run worker --ledger postgresql://" in helped.stdout
