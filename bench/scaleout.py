"""Scale out on the team ledger: `--workers` worker processes on one PostgreSQL share `--jobs` jobs
of the sim cloud's virtual machines, then one of them is killed and the others adopt its jobs.

    python bench/scaleout.py [--workers 3] [--jobs 9000] [--job-seconds 30] [--lease 30] [--poll 2]
                             [--no-kill] [--json] [--dir D]

Each worker is what `actor-run worker --until-idle` runs (supervisors/cli/worker.py: a Runner with
the worker's concurrency and lease, and its `serve` loop: claim up to the free slots every `--poll`
seconds, adopt the jobs of owners whose lease ran out), in a process of its own; the only addition
is a timer around each claim. Concurrency is jobs / workers, so the batch fits at once. The
database is a throwaway cluster (tests/support/pg.py) with PostgreSQL's durable defaults and
pg_stat_statements, over its unix socket. Intervals are bench/load.py's at --scale 10: launch 2 s,
delete 0.5 s, poll of a job 0.5 s; each job runs --job-seconds.

Part 1, share: the jobs are queued, the workers told to go together; the figures run until the
last job's end is in the ledger:
- `jobs_per_worker`: jobs each worker claimed (and ran);
- `claim_p50_s`/`claim_p99_s`: how long one `claim` call took (the claim transaction, its commit
  and the jobs handed to the batch); `queue_wait_p50_s`/`queue_wait_p99_s`: per job, from go until
  the claim that took it returned;
- `statements_per_attempt`: statements the database executed for the workers (pg_stat_statements,
  BEGIN and COMMIT included: an upper bound on round trips, a pipelined executemany counts each
  row) over the attempts run; `transactions_per_attempt`: commits and rollbacks (pg_stat_database);
- `wall_over_ideal`: from go until the last `JobEnded` over one job's ideal (launch + job + delete);
- `postgres_cpu_s`: the server's CPU over that time; `worker_cpu_s`: each worker's.
Part 2, adopt (unless --no-kill): a fresh database, the same batch; once every job runs, the
worker holding the most is killed with SIGKILL. `adopt_s` is the time from the kill until none of
its jobs is running under its name (the others claimed them: `resume` in their `serve` loop, each
poll); `lease_left_s` is how much of its lease was left at the kill (nobody may adopt before),
so `adopt_s - lease_left_s` is the adoption's own time. Then every job must end `succeeded` (a
virtual job lived in the killed process: its adopter runs it again).
Only loopback. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from ledger import DELETE_S, LAUNCH_S, POLL_S, sim_settings  # noqa: E402

from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec  # noqa: E402


def make_jobs(n: int, job_s: float, sim_dir: Path) -> list[Job]:
    policy = PolicySpec(poll_s=POLL_S, setup_grace_s=60.0, stall_after_s=30.0 + job_s, lost_after_s=12.0,
                        backoff_s=0.1, backoff_max_s=6.0, max_attempts=3)
    clouds = {"sim": sim_settings(n, job_s, sim_dir)}
    return [Job(name="scale", command="true", seed=i, timeout_s=86400.0, policy=policy,
                candidates=[CandidateSpec(cloud="sim", gpu="A100")], clouds=clouds) for i in range(n)]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def child(url: str, concurrency: int, lease_s: float, poll_s: float, root: Path) -> int:
    """One worker, as `actor-run worker --until-idle` runs: says `ready <owner>`, waits for `go`,
    serves until nothing is queued or running anywhere, prints its figures as one JSON line."""
    from loguru import logger

    from actor_run.supervisors.api.handle import JobHandle
    from actor_run.supervisors.api.runner import Runner
    from actor_run.supervisors.cli.worker import serve

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    claims: list[float] = []
    waits: list[float] = []
    go = 0.0

    class TimedRunner(Runner):
        def claim(self, most: int, run: str | None = None) -> list[JobHandle]:
            t = time.time()
            got = super().claim(most, run)
            done = time.time()
            if got:
                claims.append(done - t)
                waits.extend([done - go] * len(got))
            return got

    runner = TimedRunner(out_dir=root / "out", ledger=url, state_dir=root / "state", concurrency=concurrency,
                         lease_s=lease_s, sweep_on_start=False)
    with runner:
        print(f"ready {runner.owner}", flush=True)
        sys.stdin.readline()
        go = time.time()
        args = argparse.Namespace(concurrency=concurrency, poll=poll_s, until_idle=True)
        kept = serve(runner, args, until=None)
        ran = len(runner.handles)
    print(json.dumps({"owner": runner.owner, "kept_lease": kept, "claimed": len(waits), "ran": ran,
                      "claims": claims, "waits": waits}), flush=True)
    return 0


class Cluster:
    """The workers of one part, on one database."""

    def __init__(self, url: str, k: int, n: int, job_s: float, lease_s: float, poll_s: float, root: Path) -> None:
        from actor_run.supervisors.api.runner import Runner

        self.url, self.n = url, n
        root.mkdir(parents=True, exist_ok=True)
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        with Runner(out_dir=root / "out", ledger=url, state_dir=root / "submitter", sweep_on_start=False) as submitter:
            for job in make_jobs(n, job_s, root / "sim"):
                submitter.enqueue(job)
            submitter.ledger.flush()
        per = -(-n // k)
        self.procs = [subprocess.Popen(
            [sys.executable, __file__, "--child", url, "--concurrency", str(per), "--lease", str(lease_s),
             "--poll", str(poll_s), "--dir", str(root / f"w{i}")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(k)]
        self.owners = []
        for p in self.procs:
            assert p.stdout is not None
            word, _, owner = p.stdout.readline().strip().partition(" ")
            assert word == "ready", word
            self.owners.append(owner)

    def query(self, sql: str, *params: Any) -> Any:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            return c.execute(sql, params or None).fetchall()

    def go(self) -> float:
        self.query("SELECT pg_stat_statements_reset()")
        self.x0 = self.transactions()
        t0 = time.time()
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        return t0

    def transactions(self) -> int:
        row = self.query("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        return int(row[0][0])

    def statements(self) -> int:
        """Statements run in this database since go, but this bench's own reads (marked)."""
        rows = self.query("SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s JOIN pg_database d"
                          " ON d.oid = s.dbid WHERE d.datname = current_database() AND s.query NOT LIKE '%bench-read%'"
                          " AND s.query NOT LIKE '%pg_stat_statements%' AND s.query NOT LIKE '%pg_stat_database%'")
        return int(rows[0][0])

    def count(self, where: str, *params: Any) -> int:
        return int(self.query(f"SELECT /* bench-read */ count(*) FROM jobs WHERE {where}", *params)[0][0])

    def finish(self, timeout: float) -> list[dict[str, Any]]:
        out = []
        for p in self.procs:
            try:
                text, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate(timeout=30)
            lines = [ln for ln in (text or "").splitlines() if ln.startswith("{")]
            out.append(json.loads(lines[-1]) if lines else {})
        return out

    def check_alive(self, but: subprocess.Popen[str] | None = None) -> None:
        """No worker (but `but`, killed on purpose) failed: one that exited non-zero (a crash, its
        traceback on stderr above) fails the bench now, not at the deadline. (A worker that found
        nothing left exits 0.)"""
        for i, p in enumerate(self.procs):
            if p is not but and p.poll() not in (None, 0):
                raise RuntimeError(f"worker {i} exited with code {p.returncode} while jobs were left")

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)


def server_cpu(pid: int) -> float:
    """The server's CPU: the postmaster's, its live backends', and every backend it has reaped."""
    server = psutil.Process(pid)
    t = server.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for p in server.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def last_end(url: str) -> float:
    from actor_run.supervisors.ledger import LedgerReader

    reader = LedgerReader(url)
    try:
        return max((float(e["t"]) for e in reader.events() if e["type"] == "JobEnded"), default=0.0)
    finally:
        reader.close()


def part_share(server: Any, k: int, n: int, job_s: float, lease_s: float, poll_s: float,
               root: Path) -> dict[str, Any]:
    cluster = Cluster(server.create_database(), k, n, job_s, lease_s, poll_s, root)
    try:
        worker_procs = [psutil.Process(p.pid) for p in cluster.procs]
        cpu0 = server_cpu(server.pid())
        t0 = cluster.go()
        cpu_workers: list[float] = [0.0] * k
        deadline = time.monotonic() + 600 + 2 * job_s + 0.05 * n
        while cluster.count("state IN ('queued', 'running')") and time.monotonic() < deadline:
            cluster.check_alive()
            for i, wp in enumerate(worker_procs):  # a worker's CPU, read while it lives
                try:
                    t = wp.cpu_times()
                    cpu_workers[i] = t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            time.sleep(1.0)
        statements, xacts = cluster.statements(), cluster.transactions() - cluster.x0
        cpu1 = server_cpu(server.pid())
        results = cluster.finish(timeout=120)
        states = dict(cluster.query("SELECT /* bench-read */ state, count(*) FROM jobs GROUP BY state"))
        attempts = int(cluster.query("SELECT /* bench-read */ count(*) FROM attempts")[0][0])
        end = last_end(cluster.url)
    finally:
        cluster.kill_all()
    wall = end - t0
    ideal = LAUNCH_S + job_s + DELETE_S
    claims = [c for r in results for c in r.get("claims", [])]
    waits = [w for r in results for w in r.get("waits", [])]
    return {
        "workers": k, "jobs": n, "job_states": states, "attempts": attempts,
        "jobs_per_worker": [r.get("claimed", 0) for r in results],
        "claims": len(claims), "claim_p50_s": percentile(claims, 50), "claim_p99_s": percentile(claims, 99),
        "queue_wait_p50_s": percentile(waits, 50), "queue_wait_p99_s": percentile(waits, 99),
        "statements": statements, "statements_per_attempt": statements / max(1, attempts),
        "transactions": xacts, "transactions_per_attempt": xacts / max(1, attempts),
        "wall_s": wall, "ideal_s": ideal, "wall_over_ideal": wall / ideal,
        "postgres_cpu_s": cpu1 - cpu0, "worker_cpu_s": [round(c, 2) for c in cpu_workers],
        "worker_cpu_s_per_attempt": sum(cpu_workers) / max(1, attempts),
    }


def part_adopt(server: Any, k: int, n: int, job_s: float, lease_s: float, poll_s: float,
               root: Path) -> dict[str, Any]:
    cluster = Cluster(server.create_database(), k, n, job_s, lease_s, poll_s, root)
    try:
        cluster.go()
        deadline = time.monotonic() + 300 + 0.05 * n
        while cluster.count("state = 'running'") < n and time.monotonic() < deadline:
            cluster.check_alive()
            time.sleep(0.5)
        held = {o: cluster.count("state = 'running' AND owner = %s", o) for o in cluster.owners}
        victim = max(held, key=lambda o: held[o])
        proc = cluster.procs[cluster.owners.index(victim)]
        lease_until = cluster.query("SELECT /* bench-read */ lease_until FROM owners WHERE id = %s", victim)[0][0]
        proc.send_signal(signal.SIGKILL)
        killed = time.time()
        proc.wait(30)
        lease_left = max(0.0, float(lease_until or killed) - killed)
        while cluster.count("state = 'running' AND owner = %s", victim) and time.monotonic() < deadline + 300:
            cluster.check_alive(but=proc)
            time.sleep(0.2)
        adopt_s = time.time() - killed
        left = cluster.count("state = 'running' AND owner = %s", victim)
        end_deadline = time.monotonic() + 600 + 2 * job_s + 0.05 * n
        while cluster.count("state IN ('queued', 'running')") and time.monotonic() < end_deadline:
            cluster.check_alive(but=proc)
            time.sleep(1.0)
        cluster.finish(timeout=120)
        states = dict(cluster.query("SELECT /* bench-read */ state, count(*) FROM jobs GROUP BY state"))
    finally:
        cluster.kill_all()
    return {"adopt_jobs": held[victim], "adopt_s": adopt_s, "adopt_lease_left_s": lease_left,
            "adopt_own_s": adopt_s - lease_left, "adopt_left_unadopted": left, "adopt_job_states": states}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=9000, help="jobs in the batch, shared by the workers")
    ap.add_argument("--job-seconds", type=float, default=30.0)
    ap.add_argument("--lease", type=float, default=30.0, help="each worker's lease (renewed every third of it)")
    ap.add_argument("--poll", type=float, default=2.0, help="seconds between a worker's claims and adoption checks")
    ap.add_argument("--no-kill", action="store_true", help="skip part 2 (a worker killed, its jobs adopted)")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--dir", help="where the run's folders go (a new temporary folder in it)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.concurrency, args.lease, args.poll, Path(args.dir))
    if args.workers < 1 or args.jobs < args.workers or args.job_seconds < 0:
        ap.error("--workers >= 1, --jobs >= --workers, --job-seconds >= 0")
    from support.pg import Postgres

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the workers and the server
    root = Path(tempfile.mkdtemp(prefix="actor-run-bench-scaleout-", dir=args.dir))
    server = Postgres(settings={"fsync": "on", "max_connections": "100",
                                "shared_preload_libraries": "pg_stat_statements"})
    result: dict[str, Any] = {"lease_s": args.lease, "poll_s": args.poll, "job_s": args.job_seconds,
                              "load_average": os.getloadavg()[0]}
    try:
        result.update(part_share(server, args.workers, args.jobs, args.job_seconds, args.lease, args.poll,
                                 root / "share"))
        if not args.no_kill:
            result.update(part_adopt(server, args.workers, args.jobs, args.job_seconds, args.lease, args.poll,
                                     root / "adopt"))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not args.json:
        r = result
        print(f"{r['workers']} workers, {r['jobs']} jobs of {r['job_s']:g} s: jobs per worker {r['jobs_per_worker']}, "
              f"states {r['job_states']}")
        print(f"claim p50 / p99 {r['claim_p50_s']:.3f} / {r['claim_p99_s']:.3f} s ({r['claims']} claims); queue wait "
              f"p50 / p99 {r['queue_wait_p50_s']:.2f} / {r['queue_wait_p99_s']:.2f} s")
        print(f"statements / attempt {r['statements_per_attempt']:.1f}, transactions / attempt "
              f"{r['transactions_per_attempt']:.2f}; PostgreSQL CPU {r['postgres_cpu_s']:.1f} s, workers' CPU "
              f"{r['worker_cpu_s']} s ({r['worker_cpu_s_per_attempt'] * 1000:.1f} ms / attempt)")
        print(f"wall / ideal {r['wall_s']:.1f} s / {r['ideal_s']:.1f} s = {r['wall_over_ideal']:.3f}")
        if "adopt_s" in r:
            print(f"adopt {r['adopt_jobs']} jobs of a killed worker: {r['adopt_s']:.1f} s after the kill "
                  f"({r['adopt_lease_left_s']:.1f} s of its lease left then: {r['adopt_own_s']:.1f} s of adoption); "
                  f"states after {r['adopt_job_states']}")
    print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in result.items()}), flush=True)
    ok = set(result["job_states"]) == {"succeeded"} and set(result.get("adopt_job_states", {"succeeded": 0})) == {
        "succeeded"}
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
