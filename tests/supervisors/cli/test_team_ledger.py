"""A team's shared ledger survives what teams do (issue 28): real `actor-run worker` processes on a
real PostgreSQL server (tests/support/pg.py) and the sim cloud, with scaled times. Busy workers adopt at
once, a database restart loses nothing, a frozen worker writes no byte after its lease ran out, a
stopped worker hands its jobs back, logs never repeat, `logs` works for submitted runs.

The job (tests/support/controller_kit.py's, printing a line per step) holds an exclusive lock per seed while it runs
(a second copy of a seed running at the same time writes OVERLAP to the trace) and writes `start`
and `end` lines there: a seed that ran twice has two `start` lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_inproc import CLI, run_cli
from support.controller_kit import JOB, release, trace_lines, write_batch
from support.pg import Postgres
from support.waits import poll
from test_shared_ledger import LEASE_S, POLL_S, Controller, check_every_job_ended_once, cli, jobs

from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.ledger.db import close_pools

# the chaos job, saying each step on its standard output too (what log.txt holds)
PRINTING_JOB = JOB.replace("    progress.flush()\n", "    progress.flush()\n    print(f'step {step}', flush=True)\n")
assert PRINTING_JOB != JOB


@pytest.fixture
def url(postgres: Any) -> Iterator[str]:
    yield postgres.create_database()
    close_pools()


def team_batch(tmp: Path, *, seeds: int, steps: int, hold: bool = False) -> Path:
    """The chaos batch, jobs of `steps` quarter seconds that print each step (and with `hold`, then
    wait for `release(tmp)`)."""
    batch = write_batch(tmp, seeds=seeds, latency=0.2)
    held, public = (' HOLD = "1",', '"HOLD", ') if hold else ("", "")
    batch.write_text(batch.read_text().replace("env = { TRACE", f'env = {{{held} STEPS = "{steps}", TRACE')
                     .replace('public_env = ["TRACE"]', f'public_env = [{public}"STEPS", "TRACE"]'))
    (tmp / "code" / "job.py").write_text(PRINTING_JOB)
    return batch


def submit(tmp: Path, url: str, batch: Path) -> str:
    queued = cli(tmp, "run", str(batch), "--ledger", url, "--submit-only", "--out", str(tmp / "out"))
    assert queued.returncode == 0, queued.stderr
    m = re.search(r"run (\w+): queued", queued.stdout)
    assert m, queued.stdout
    return m.group(1)


def keys_started(c: Controller) -> set[str]:
    return {f"{e['job']}/seed-{e['seed']}" for e in c.events if e["type"] == "JobStarted"}


def ledger_events(url: str) -> list[dict[str, Any]]:
    reader = LedgerReader(url)
    try:
        return list(reader.events())
    finally:
        reader.close()


def wait_until(condition: Any, timeout: float, what: str, every: float = 0.1) -> float:
    """Seconds until `condition()` holds (polled every `every` s), failing past `timeout`."""
    start = time.monotonic()
    poll(condition, timeout, what, every=every)
    return time.monotonic() - start


def check_ran_once_and_logs_whole(tmp: Path, seeds: int, steps: int) -> None:
    """Each seed started once (none ran twice) and its log.txt holds each step once, in order, under
    one header of attempt 0."""
    starts = [ln.split()[1] for ln in trace_lines(tmp) if ln.startswith("start")]
    assert sorted(starts) == sorted(str(s) for s in range(1, seeds + 1)), starts
    for s in range(1, seeds + 1):
        log = (tmp / "out" / "latest" / "chaos" / f"seed-{s}" / "log.txt").read_text()
        assert len(re.findall(r"^--- run \w+ attempt 0 on ", log, re.MULTILINE)) == 1, log
        said = re.findall(r"^step (\d+)$", log, re.MULTILINE)
        assert said == [str(i) for i in range(steps)], (s, log)


def test_a_busy_survivor_watches_every_adopted_job_at_once_and_none_runs_twice(tmp_path: Path, url: str) -> None:
    """Item 1: the survivor runs its full concurrency when the other worker is killed -9; it
    adopts and watches all of the dead worker's jobs within the lease plus one poll (not when its
    own end), none runs twice, and each adopted log goes on under its one header (item 4)."""
    seeds, steps = 6, 20  # 5 s jobs, then held until the adoption was seen: the survivor's own outlive it
    batch = team_batch(tmp_path, seeds=seeds, steps=steps, hold=True)
    submit(tmp_path, url, batch)
    survivor = Controller(tmp_path, url, "survivor", concurrency=3)
    survivor.wait_for("JobStarted", 3)
    victim = Controller(tmp_path, url, "victim", concurrency=3)
    victim.wait_for("JobStarted", 3)
    orphans = keys_started(victim)
    own = keys_started(survivor)
    assert len(orphans) == 3
    assert not orphans & own
    # the victim's jobs have written some log (what the adopter must not write again)
    wait_until(lambda: all((tmp_path / "out" / "latest" / k / "log.txt").exists()
                           and "step 1" in (tmp_path / "out" / "latest" / k / "log.txt").read_text() for k in orphans),
               30, "the victim's jobs logging")
    victim.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.finish()

    def watched() -> bool:
        """The survivor's attempt holds each orphan's machine again (its Leased, on adoption)."""
        leased = {f"{e['job']}/seed-{e['seed']}" for e in survivor.events if e["type"] == "Leased"}
        return orphans <= leased

    waited = wait_until(watched, LEASE_S + POLL_S + 30, "adopted jobs watched")
    ended_before = {f"{e['job']}/seed-{e['seed']}" for e in survivor.events if e["type"] == "JobEnded"}
    assert not ended_before & own, "the survivor was not at full concurrency when it adopted"
    print(f"every adopted job watched {waited:.2f} s after the kill (bound {LEASE_S + POLL_S:.1f} s)")
    # the lease ran out at most LEASE_S after its last renewal; a poll later it was watched (plus
    # what the poll's claim, sweep and the attempt's start take on a loaded machine)
    assert waited <= LEASE_S + POLL_S + 5.0, waited
    assert time.monotonic() - killed >= waited
    release(tmp_path)
    assert survivor.finish(timeout=180) == 0, survivor.stderr
    check_every_job_ended_once(tmp_path, url, seeds)
    check_ran_once_and_logs_whole(tmp_path, seeds, steps)
    for k in orphans:
        log = (tmp_path / "out" / "latest" / k / "log.txt").read_text()
        assert log.count(" taken over by controller ") == 1, log
        response = json.loads((tmp_path / "out" / "latest" / k / "response.json").read_text())
        # the whole attempt, not the adopter's part: the run phase covers the job's 15 s
        assert response["attempts"][0]["phases"]["run"] >= steps * 0.25 * 0.9, response
        assert response["seconds"] >= steps * 0.25 * 0.9, response


def test_a_database_restart_mid_batch_loses_nothing(tmp_path: Path) -> None:
    """Item 2: `pg_ctl restart -m fast` under two busy workers: every job succeeds once, none is
    canceled, nothing is left; the workers ride the outage out and exit 0."""
    server = Postgres()
    try:
        url = server.create_database()
        seeds, steps = 6, 24
        batch = team_batch(tmp_path, seeds=seeds, steps=steps)
        submit(tmp_path, url, batch)
        workers = [Controller(tmp_path, url, name, concurrency=3, lease=15.0) for name in ("a", "b")]
        for w in workers:
            w.wait_for("JobStarted", 2)
        close_pools()  # the test's own read connections die with the restart too
        server.restart()
        for w in workers:
            assert w.finish(timeout=240) == 0, w.stderr
            assert "Traceback" not in w.stderr, w.stderr
        assert any("ledger is back" in w.stderr for w in workers), [w.stderr for w in workers]
        check_every_job_ended_once(tmp_path, url, seeds)
        check_ran_once_and_logs_whole(tmp_path, seeds, steps)
        ended = [e for e in ledger_events(url) if e["type"] == "JobEnded"]
        assert [e for e in ended if "canceled" in json.dumps(e)] == []
        assert all(j["failure"] is None for j in jobs(url).values())
    finally:
        close_pools()
        server.stop()


def test_a_frozen_worker_writes_no_byte_after_its_lease_ran_out(tmp_path: Path, url: str) -> None:
    """Item 3: SIGSTOP past the lease, then SIGCONT: nothing more from the frozen worker, in the
    ledger (its event rows) or on disk (its jobs' log.txt, outputs, response.json: each step once,
    under one header, whatever it had read and not yet written when it froze)."""
    seeds, steps = 4, 28
    batch = team_batch(tmp_path, seeds=seeds, steps=steps)
    submit(tmp_path, url, batch)
    frozen = Controller(tmp_path, url, "frozen", concurrency=2)
    frozen.wait_for("JobStarted", 2)
    held = keys_started(frozen)
    logs = tmp_path / "out" / "latest"
    wait_until(lambda: all("step 2" in (logs / k / "log.txt").read_text()
                           for k in held if (logs / k / "log.txt").exists())
               and all((logs / k / "log.txt").exists() for k in held), 30, "the frozen worker's logs")
    owner = next(iter({jobs(url)[k]["owner"] for k in held}))
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        adopter = Controller(tmp_path, url, "adopter", concurrency=2)
        wait_until(lambda: all(jobs(url)[k]["owner"] != owner for k in held), LEASE_S + 60, "adoption")
        written = sum(e["owner"] == owner for e in ledger_events(url))
        # the adopter writes on: the frozen worker's jobs end while it is still frozen
        adopter.wait_for("JobEnded", seeds, timeout=120)
        sizes = {k: (tmp_path / "out" / "latest" / k / "log.txt").stat().st_size for k in held}
        responses = {k: (tmp_path / "out" / "latest" / k / "response.json").read_bytes() for k in held}
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    assert frozen.finish() == 0  # it let its jobs go and joined again as a new owner (nothing left to do)
    assert "lease in the ledger" in frozen.stderr, frozen.stderr
    assert "joining again as a new worker" in frozen.stderr, frozen.stderr
    assert "Traceback" not in frozen.stderr, frozen.stderr
    assert adopter.finish() == 0, adopter.stderr
    assert sum(e["owner"] == owner for e in ledger_events(url)) == written  # no row after the lease ran out
    assert {k: (tmp_path / "out" / "latest" / k / "log.txt").stat().st_size for k in held} == sizes  # no log byte
    assert {k: (tmp_path / "out" / "latest" / k / "response.json").read_bytes() for k in held} == responses
    check_every_job_ended_once(tmp_path, url, seeds)
    check_ran_once_and_logs_whole(tmp_path, seeds, steps)


def test_sigterm_hands_a_workers_jobs_to_the_other_at_once(tmp_path: Path, url: str) -> None:
    """Item 6: SIGTERM of a worker: it exits 0 at once without deleting its machines; the other,
    at full concurrency, adopts its running jobs at its next poll (not after a lease) and finishes
    them; none is canceled or run twice."""
    seeds, steps = 4, 40
    batch = team_batch(tmp_path, seeds=seeds, steps=steps)
    submit(tmp_path, url, batch)
    leaving = Controller(tmp_path, url, "leaving", concurrency=2, lease=30.0)  # a lease it never waits out
    leaving.wait_for("JobStarted", 2)
    staying = Controller(tmp_path, url, "staying", concurrency=2, lease=30.0)
    staying.wait_for("JobStarted", 2)
    handed = keys_started(leaving)
    leaving.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    assert leaving.finish(timeout=25) == 0, leaving.stderr  # at once (see test_status_follow_shows_an_adoption)
    assert "handed back 2 job(s)" in leaving.stderr, leaving.stderr
    let_go = [e for e in leaving.events if e["type"] == "Released"]
    assert len(let_go) == 2, let_go
    assert not any(e["confirmed"] for e in let_go), let_go  # its machines left running, for the adopter

    def adopted() -> bool:
        return handed <= {f"{e['job']}/seed-{e['seed']}" for e in staying.events if e["type"] == "Leased"}

    wait_until(adopted, 30, "adoption after SIGTERM")
    waited = time.monotonic() - sent
    assert waited < 30.0 - 5, waited  # well within the lease: the owner closed, not expired
    assert staying.finish(timeout=180) == 0, staying.stderr
    check_every_job_ended_once(tmp_path, url, seeds)
    check_ran_once_and_logs_whole(tmp_path, seeds, steps)
    assert not [e for e in ledger_events(url) if e["type"] == "JobEnded" and "canceled" in json.dumps(e)]


def test_logs_follow_a_submitted_run_from_queued_to_its_end(tmp_path: Path, url: str) -> None:
    """Item 5: `logs -f` of a queued job waits for it to start and follows it to its end; the
    submitter's exit does not end the run (so `logs` prints its parts); its last job does."""
    steps = 8
    batch = team_batch(tmp_path, seeds=1, steps=steps)
    run = submit(tmp_path, url, batch)
    reader = LedgerReader(url)
    try:
        row = reader.run(run)
        assert row is not None
        assert row.ended is None
    finally:
        reader.close()
    follow = subprocess.Popen([*CLI, "logs", "chaos/1", "-f", "--ledger", url, "--state-dir", str(tmp_path / "state")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            follow.wait(2.0)  # queued: it waits for the job, it does not return at once
        worker = Controller(tmp_path, url, "w", concurrency=1)
        out, err = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert re.findall(r"^step (\d+)$", out, re.MULTILINE) == [str(i) for i in range(steps)], out
    assert worker.finish() == 0, worker.stderr
    printed = cli(tmp_path, "logs", "chaos/1", "--ledger", url)
    assert printed.returncode == 0, printed.stderr
    assert re.findall(r"^step (\d+)$", printed.stdout, re.MULTILINE) == [str(i) for i in range(steps)]
    reader = LedgerReader(url)
    try:
        row = reader.run(run)
        assert row is not None
        assert row.ended is not None
    finally:
        reader.close()


def test_the_rough_edges(tmp_path: Path, url: str, postgres: Any) -> None:
    """Item 7: the submit hint names the ledger; a bad URL is one line, exit 2, no password; an
    unreachable database is one line, exit 1, after a bounded wait (status too, not 30 s);
    `sweep --dry-run` writes no owner row; `status --follow` shows an adoption."""
    batch = team_batch(tmp_path, seeds=1, steps=2)
    queued = cli(tmp_path, "run", str(batch), "--ledger", url, "--submit-only", "--out", str(tmp_path / "out"))
    assert f"--ledger {url}" in queued.stdout or f"--ledger '{url}'" in queued.stdout, queued.stdout
    with_password = cli(tmp_path, "run", str(batch), "--ledger", url.replace("postgres@", "postgres:s3cret@"),
                        "--submit-only", "--out", str(tmp_path / "out"))
    assert with_password.returncode == 0, with_password.stderr
    assert "s3cret" not in with_password.stdout
    assert "ACTOR_RUN_LEDGER" in with_password.stdout
    bad = cli(tmp_path, "status", "--ledger", "postgresql://u:s3cret@/db?bogus=1")
    assert bad.returncode == 2, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "--ledger" in bad.stderr
    assert "s3cret" not in bad.stderr
    gone = f"postgresql://u:s3cret@/db?host={tmp_path / 'no-server'}"
    for args in (["status"], ["runs"], ["worker", "--ledger-wait", "1"]):
        started = time.monotonic()
        done = cli(tmp_path, *args, "--ledger", gone, timeout=60)
        took = time.monotonic() - started
        assert done.returncode == 1, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "cannot be reached" in done.stderr
        assert "s3cret" not in done.stderr
        assert took < 20, (args, took)  # a bounded wait, not the pool's 30 s
    import psycopg

    def owners() -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM owners").fetchone()
            assert row is not None
            return int(row[0])

    before = owners()
    dry = cli(tmp_path, "sweep", "--dry-run", "--ledger", url)
    assert dry.returncode == 0, dry.stderr
    assert owners() == before  # the submitters' rows, none of the dry run's


def test_a_worker_started_before_its_database_waits_for_it(tmp_path: Path) -> None:
    """Item 7: a worker whose database is not up yet waits (up to --ledger-wait) and then works."""
    server = Postgres()
    try:
        url = server.create_database()
        batch = team_batch(tmp_path, seeds=1, steps=2)
        submit(tmp_path, url, batch)
        close_pools()
        server.stop_server()
        worker = subprocess.Popen(
            [*CLI, "worker", "--until-idle", "--ledger", url, "--ledger-wait", "60", "--poll", str(POLL_S), "--out",
             str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        assert worker.stderr is not None
        first = worker.stderr.readline()  # said once it found the database away (blocks until then)
        assert "waiting up to 60 s" in first, first
        server.start_server()
        _out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, first + err
        assert jobs(url)["chaos/seed-1"]["state"] == "succeeded"
    finally:
        close_pools()
        server.stop()


def test_status_follow_shows_an_adoption(tmp_path: Path, url: str) -> None:
    """Item 7: `status --follow` prints a line when a running job changes owner (an adoption)."""
    batch = team_batch(tmp_path, seeds=2, steps=60)  # 15 s jobs: still running when the SIGTERM lands
    run = submit(tmp_path, url, batch)
    leaving = Controller(tmp_path, url, "leaving", concurrency=2, lease=30.0)
    leaving.wait_for("JobStarted", 2)
    follow = subprocess.Popen([*CLI, "status", "--run", run, "--follow", "--poll", "0.2", "--ledger", url,
                               "--state-dir", str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    stuck = threading.Timer(60, follow.kill)  # bounds the first read below
    stuck.start()
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # its first look, taken while the leaving worker holds the jobs
        stuck.cancel()
        assert "chaos/seed-" in first, first
        staying = Controller(tmp_path, url, "staying", concurrency=1, lease=30.0)
        leaving.proc.send_signal(signal.SIGTERM)
        # at once: it deletes nothing and waits for no job (a reactor wake-up lost in the actor pool once
        # made its close wait 30 s per cloud on a call the reactor never saw)
        assert leaving.finish(timeout=25) == 0, leaving.stderr
        assert staying.finish(timeout=180) == 0, staying.stderr
        out, err = follow.communicate(timeout=60)
        out = first + out
    finally:
        stuck.cancel()
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert out.count("adopted from") == 2, out


def test_drain_finishes_the_jobs_held_and_takes_no_more(tmp_path: Path, url: str) -> None:
    """Item 6, `--drain`: the first SIGTERM stops the worker taking jobs; those it holds finish
    here (not handed back, not canceled), the one still queued stays queued, and it exits 0."""
    batch = team_batch(tmp_path, seeds=3, steps=16)
    submit(tmp_path, url, batch)
    worker = Controller(tmp_path, url, "draining", concurrency=2, extra=("--drain",))
    worker.wait_for("JobStarted", 2)
    held = keys_started(worker)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.finish(timeout=120) == 0, worker.stderr
    assert "draining" in worker.stderr
    rows = jobs(url)
    assert {k for k, j in rows.items() if j["state"] == "succeeded"} == held
    assert [j["state"] for k, j in rows.items() if k not in held] == ["queued"]
    assert not [e for e in worker.events if e["type"] == "Released" and not e["confirmed"]]  # deleted as usual


def test_a_secret_the_worker_lacks_ends_the_job_input_without_renting(
    tmp_path: Path, url: str,
) -> None:
    """A job's env value the ledger kept out (not in public_env) comes from the worker's own
    environment; a worker without it never runs the job with a placeholder, nor rents for it."""
    batch = team_batch(tmp_path, seeds=2, steps=2)
    batch.write_text(batch.read_text().replace("env = { STEPS", 'env = { API_TOKEN = "tok-4242", STEPS'))
    submit(tmp_path, url, batch)
    env = {k: v for k, v in os.environ.items() if k != "API_TOKEN"}
    lacking = run_cli(["worker", "--until-idle", "--ledger", url, "--concurrency", "2", "--json",
                              "--poll", str(POLL_S), "--out", str(tmp_path / "out"), "--state-dir",
                              str(tmp_path / "state")],
                             timeout=120, cwd=tmp_path, env=env)
    evs = [json.loads(x) for x in lacking.stdout.splitlines()]
    assert [e for e in evs if e["type"] == "LeaseRequested"] == []
    ended = [(e["seed"], e["failure"]) for e in evs if e["type"] == "JobEnded"]
    assert sorted(ended) == [(1, "input"), (2, "input")], lacking.stderr
    assert all("API_TOKEN" in e["detail"] for e in evs if e["type"] == "JobEnded")
    assert "tok-4242" not in lacking.stdout + lacking.stderr
    rows = jobs(url)
    assert {k: (r["state"], r["failure"]) for k, r in rows.items()} == {
        "chaos/seed-1": ("failed", "input"), "chaos/seed-2": ("failed", "input")}
