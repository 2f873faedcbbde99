"""The ledger's two backends, side by side, and three controllers sharing one PostgreSQL ledger.

    python bench/ledger.py [--events N] [--attempts N] [--controllers K] [--job-seconds S] [--json]

Part 1, events per second: one controller's Ledger takes `--events` Progress events from one
thread as fast as `record_event` returns, then `flush()`; the figure is events / (time from the
first call until the flush returns), for an SQLite file (WAL, synchronous=NORMAL, in a temporary
folder) and for a PostgreSQL database on the same computer (a throwaway cluster, tests/support/pg.py,
with PostgreSQL's durable defaults: fsync on, synchronous_commit on), over its unix socket.

Part 2, `--controllers` controllers x `--attempts` attempts each on PostgreSQL: the batch
(controllers x attempts jobs) is queued in the shared ledger, then K worker processes (each a
Runner, concurrency = attempts) claim and run them on the sim cloud's virtual machines (one shared
sim folder), as `actor-run worker` does. Intervals are load.py's at --scale 10: launch 2 s, delete
0.5 s, poll 0.5 s; the job runs --job-seconds (30).
- `wall_over_ideal`: from the moment the workers are told to go (the jobs are queued and every
  worker's Runner is open) until the last job's end is in the ledger, over the ideal of one job
  (launch + job + delete: every attempt runs at once, so the slowest is the ideal).
- `commits_per_s`: the workers' ledger transactions (Ledger.commits, summed) over the wall;
  `xact_per_s`: every transaction the database counted (pg_stat_database), reads included.
- `postgres_cpu_s`: the CPU time of the PostgreSQL server's processes over the wall (psutil),
  and `postgres_cpu_share`: that over the wall (1.0 is one core busy all the time).

Part 3, the baseline, in the same run (unless --no-baseline): the same path with ONE worker of
`--attempts` attempts, on PostgreSQL (`one_postgresql_*`) and on an SQLite file (`one_sqlite_*`):
what the shared ledger costs one controller, and what three controllers on one computer cost
each other (they share its cores: on a 2-core machine, three busy controllers are CPU-bound).

Part 4, a team's day (`--team`, alone: `python bench/ledger.py --team`): two `actor-run worker`
processes (`--lease 6 --poll 0.5`, concurrency `--team-each` each) on one PostgreSQL ledger, the
sim cloud's local sandboxes (a virtual machine lives in one process: no other can reattach to it)
running `sleep --team-job-seconds` (30):
- `adoption_s`: one worker is killed -9 once both run their full concurrency; the seconds from
  the kill until the survivor (still at full concurrency) holds every one of the dead worker's
  machines again (its `Leased` event for each, in the ledger). The bound is the lease plus one
  poll (6.5 s); before issue 28 the adopted jobs waited for free slots (the survivor's own jobs'
  end).
- `restart_wall_s` against `steady_wall_s`: the same batch (2 x each jobs) with `pg_ctl restart -m
  fast` once every job runs, and without; from `go` to the last job's end in the ledger, with
  every job's state (`restart_job_states`: all `succeeded`, none canceled). These workers hold a
  15 s lease: the outage a worker rides out is bounded by what is left of its lease, and a
  restart under load took 4-7 s here (with 6 s leases, once, it outlasted both leases: both workers
  let their jobs go; a worker that loses its lease now joins again as a new owner, which adopts
  what is orphaned).
Only loopback: the database listens on a unix socket in a temporary folder. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
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

import psutil  # noqa: E402

from actor_run.protocols.messages import Progress  # noqa: E402
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec  # noqa: E402
from actor_run.supervisors.ledger import Ledger, LedgerReader  # noqa: E402

SCALE = 10.0
LAUNCH_S, DELETE_S, POLL_S = 20.0 / SCALE, 5.0 / SCALE, 5.0 / SCALE


def events_per_s(location: str | Path, n: int) -> float:
    led = Ledger(location, "bench" + os.urandom(8).hex())
    try:
        events = [Progress(job="bench", seed=i % 1000, attempt=0, stage="train", line={"step": i, "checkpoint": 1})
                  for i in range(n)]
        t0 = time.perf_counter()
        for e in events:
            led.record_event(e)
        led.flush()
        return n / (time.perf_counter() - t0)
    finally:
        led.close()


def sim_settings(n: int, job_s: float, sim_dir: Path, virtual: bool = True) -> dict[str, Any]:
    return {"virtual": virtual, "virtual_job_s": job_s, "seed": 1, "state_dir": str(sim_dir),
            "launch_latency_s": LAUNCH_S, "delete_latency_s": DELETE_S,
            "regions": [{"name": "us-east", "gpus": {"A100": {"stock": n, "hourly_usd": 1.8}}}]}


def make_jobs(n: int, job_s: float, sim_dir: Path, virtual: bool = True) -> list[Job]:
    """`n` jobs of `job_s` on the sim cloud: virtual machines (they live in one process), or (not
    `virtual`) local sandboxes running `sleep`, which another process can reattach to."""
    policy = PolicySpec(poll_s=POLL_S, setup_grace_s=60.0, stall_after_s=30.0 + job_s, lost_after_s=12.0,
                        backoff_s=0.1, backoff_max_s=6.0, max_attempts=1)
    clouds = {"sim": sim_settings(n, job_s, sim_dir, virtual)}
    command = "true" if virtual else f"sleep {job_s:g}"
    return [Job(name="bench", command=command, seed=i, timeout_s=86400.0, policy=policy,
                candidates=[CandidateSpec(cloud="sim", gpu="A100")], clouds=clouds) for i in range(n)]


def child(url: str, concurrency: int, root: Path) -> int:
    """A worker: opens its Runner, says ready, waits for `go` on stdin, claims and runs until
    nothing is queued and its own jobs have ended; prints its figures as one JSON line."""
    from actor_run.supervisors.api.runner import Runner

    runner = Runner(out_dir=root / "out", ledger=url, state_dir=root / "state", concurrency=concurrency,
                    sweep_on_start=False, meter_period_s=6.0)
    with runner:
        print("ready", flush=True)
        sys.stdin.readline()
        claimed, handles = 0, []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            got = runner.claim(concurrency - sum(not h.done() for h in handles))
            claimed += len(got)
            handles += got
            if not got and all(h.done() for h in handles):
                break
            time.sleep(POLL_S)
        runner.wait(timeout=120)
        outcomes: dict[str, int] = {}
        for h in handles:
            o = h.result(0).outcome
            outcomes[o] = outcomes.get(o, 0) + 1
        commits = runner.ledger.commits
    print(json.dumps({"claimed": claimed, "outcomes": outcomes, "commits": commits}), flush=True)
    return 0


def shared(url: str, server_pid: int | None, k: int, n: int, job_s: float, root: Path) -> dict[str, Any]:
    """k workers x n attempts each on the ledger `url` (a postgresql:// URL, or an SQLite file's
    path: then `server_pid` is None and the server's figures are not measured)."""
    from actor_run.supervisors.api.runner import Runner

    root.mkdir(parents=True, exist_ok=True)
    sim_dir = root / "sim"
    procs = [subprocess.Popen([sys.executable, __file__, "--child", url, "--concurrency", str(n), "--dir",
                               str(root / f"w{i}")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(k)]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        with Runner(out_dir=root / "out", ledger=url, state_dir=root / "submitter", sweep_on_start=False) as submitter:
            for job in make_jobs(k * n, job_s, sim_dir):
                submitter.enqueue(job)
            submitter.ledger.flush()
        def pg_cpu() -> float:
            """The server's CPU: the postmaster's, its live backends', and (in the postmaster's
            children_* counters) that of every backend it has reaped."""
            if server_pid is None:
                return 0.0
            server = psutil.Process(server_pid)
            t = server.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            for p in server.children(recursive=True):
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    continue
            return total

        def xacts() -> int:
            if server_pid is None:
                return 0
            import psycopg

            with psycopg.connect(url, autocommit=True) as c:
                row = c.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
                                ).fetchone()
                return int(row[0]) if row else 0

        cpu0, x0, t0 = pg_cpu(), xacts(), time.time()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=900)
            results.append(json.loads(out.strip().splitlines()[-1]))
        reader = LedgerReader(url)
        try:
            rows = reader.jobs()
            last = max(float(e["t"]) for e in reader.events() if e["type"] == "JobEnded")
        finally:
            reader.close()
        wall = last - t0
        cpu1, x1 = pg_cpu(), xacts()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    ideal = LAUNCH_S + job_s + DELETE_S
    commits = sum(r["commits"] for r in results)
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    return {"controllers": k, "attempts_each": n, "claimed": [r["claimed"] for r in results], "job_states": states,
            "wall_s": wall, "ideal_s": ideal, "wall_over_ideal": wall / ideal, "commits": commits,
            "commits_per_s": commits / wall, "xact_per_s": (x1 - x0) / wall, "postgres_cpu_s": cpu1 - cpu0,
            "postgres_cpu_share": (cpu1 - cpu0) / wall}


def team_worker(url: str, root: Path, each: int, lease_s: float = 6.0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "actor_run", "worker", "--ledger", url, "--concurrency", str(each),
                             "--lease", f"{lease_s:g}", "--poll", "0.5", "--until-idle", "--out", str(root / "out"),
                             "--state-dir", str(root / "state")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def wait_ledger(url: str, condition: Any, timeout: float, what: str) -> Any:
    """Poll the ledger (every 0.1 s) until `condition(reader)` answers something true; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        reader = LedgerReader(url)
        try:
            got = condition(reader)
        except Exception:  # the database restarting: ask again
            got = None
        finally:
            reader.close()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def team_batch(url: str, root: Path, n: int, job_s: float) -> None:
    from actor_run.supervisors.api.runner import Runner

    with Runner(out_dir=root / "out", ledger=url, state_dir=root / "submitter", sweep_on_start=False) as submitter:
        for job in make_jobs(n, job_s, root / "sim", virtual=False):
            submitter.enqueue(job)
        submitter.keep_run_open()
        submitter.ledger.flush()


def running_by_owner(reader: LedgerReader) -> dict[str, set[str]]:
    owners: dict[str, set[str]] = {}
    for j in reader.jobs():
        if j["state"] == "running":
            owners.setdefault(j["owner"], set()).add(j["key"])
    return owners


def machines_running(reader: LedgerReader, want: int) -> bool:
    return sum(m.state == "alive" and m.phase == "running" for m in reader.machines()) >= want


def adoption(url: str, root: Path, each: int, job_s: float) -> float:
    """Seconds from the kill -9 of one of two full workers until the survivor holds all its machines."""
    team_batch(url, root, 2 * each, job_s)
    a = team_worker(url, root / "a", each)
    b = team_worker(url, root / "b", each)
    try:
        wait_ledger(url, lambda r: machines_running(r, 2 * each), 120, "every job running")
        by_owner = wait_ledger(url, lambda r: (lambda o: o if len(o) == 2 else None)(running_by_owner(r)), 30, "owners")
        reader = LedgerReader(url)
        try:
            owners = {o.id: o.pid for o in reader.owners()}
        finally:
            reader.close()
        victim = next(o for o in by_owner if owners.get(o) == b.pid)
        orphans = by_owner[victim]
        b.kill()
        killed = time.time()

        def adopted(r: LedgerReader) -> bool:
            leased = {e["job"] for e in r.events()  # (a ledger event's job is the job's key)
                      if e["type"] == "Leased" and e["owner"] != victim and float(e["t"]) >= killed}
            return orphans <= leased

        wait_ledger(url, adopted, 120, "adoption")
        reader = LedgerReader(url)
        try:
            last = max(float(e["t"]) for e in reader.events()
                       if e["type"] == "Leased" and e["owner"] != victim and float(e["t"]) >= killed)
        finally:
            reader.close()
        a.communicate(timeout=300)
        return last - killed
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
            p.wait(30)


def across_restart(server: Any, root: Path, each: int, job_s: float, restart: bool) -> tuple[float, dict[str, int]]:
    """Wall seconds of a 2 x each batch on two workers (with a database restart once all run)."""
    from actor_run.supervisors.ledger.db import close_pools

    url = server.create_database()
    team_batch(url, root, 2 * each, job_s)
    go = time.time()
    workers = [team_worker(url, root / name, each, lease_s=15.0) for name in ("a", "b")]
    try:
        wait_ledger(url, lambda r: machines_running(r, 2 * each), 120, "every job running")
        if restart:
            close_pools()
            server.restart()
        for w in workers:
            w.communicate(timeout=600)
        reader = LedgerReader(url)
        try:
            last = max(float(e["t"]) for e in reader.events() if e["type"] == "JobEnded")
            states: dict[str, int] = {}
            for j in reader.jobs():
                state = j["state"] + (f":{j['failure']}" if j["failure"] else "")
                states[state] = states.get(state, 0) + 1
        finally:
            reader.close()
        return last - go, states
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait(30)


def team_day(each: int, job_s: float, root: Path) -> dict[str, Any]:
    from support.pg import Postgres

    from actor_run.supervisors.ledger.db import close_pools

    server = Postgres(settings={"fsync": "on", "max_connections": "100"})
    try:
        result: dict[str, Any] = {"team_each": each, "team_job_s": job_s}
        result["adoption_s"] = adoption(server.create_database(), root / "adopt", each, job_s)
        result["steady_wall_s"], result["steady_job_states"] = across_restart(server, root / "steady", each, job_s,
                                                                              False)
        result["restart_wall_s"], result["restart_job_states"] = across_restart(server, root / "restart", each,
                                                                                job_s, True)
        result["ideal_s"] = LAUNCH_S + job_s + DELETE_S
        close_pools()
    finally:
        server.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20000, help="events written in part 1")
    ap.add_argument("--attempts", type=int, default=1000, help="attempts per controller in part 2")
    ap.add_argument("--controllers", type=int, default=3)
    ap.add_argument("--job-seconds", type=float, default=30.0)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--no-baseline", action="store_true", help="skip the one-controller runs")
    ap.add_argument("--team", action="store_true", help="only part 4: adoption and a database restart")
    ap.add_argument("--team-each", type=int, default=20, help="part 4: concurrency of each of the two workers")
    ap.add_argument("--team-job-seconds", type=float, default=30.0)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the controllers and the server
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    if args.child:
        return child(args.child, args.concurrency, Path(args.dir))
    from support.pg import Postgres

    from actor_run.supervisors.ledger.db import close_pools

    root = Path(tempfile.mkdtemp(prefix="actor-run-bench-ledger-", dir=args.dir))
    if args.team:
        try:
            day = team_day(args.team_each, args.team_job_seconds, root)
        finally:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        if not args.json:
            print(f"adoption at full concurrency ({args.team_each} each): {day['adoption_s']:.2f} s after the kill "
                  f"(bound 6.5 s); 2 x {args.team_each} jobs of {args.team_job_seconds:g} s: wall "
                  f"{day['steady_wall_s']:.1f} s steady, {day['restart_wall_s']:.1f} s across a database restart "
                  f"(ideal {day['ideal_s']:.1f} s), jobs {day['restart_job_states']}")
        print(json.dumps(day))
        return 0 if set(day["restart_job_states"]) == {"succeeded"} else 1
    server = Postgres(settings={"fsync": "on", "max_connections": "100"})
    try:
        result: dict[str, Any] = {
            "events": args.events,
            "sqlite_events_per_s": events_per_s(root / "ledger.sqlite", args.events),
            "postgresql_events_per_s": events_per_s(server.create_database(), args.events),
        }
        result.update(shared(server.create_database(), server.pid(), args.controllers, args.attempts,
                             args.job_seconds, root / "shared"))
        if not args.no_baseline:
            # the same path, one controller: on PostgreSQL, and on SQLite (the default ledger)
            for name, location, pid in (("one_postgresql", server.create_database(), server.pid()),
                                        ("one_sqlite", str(root / "one-sqlite" / "ledger.sqlite"), None)):
                one = shared(location, pid, 1, args.attempts, args.job_seconds, root / name)
                result.update({f"{name}_{k}": one[k] for k in ("wall_over_ideal", "commits_per_s", "job_states")})
                if pid is not None:
                    result[f"{name}_postgres_cpu_s"] = one["postgres_cpu_s"]
        close_pools()
    finally:
        server.stop()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    if not args.json:
        print(f"events/s, one controller: SQLite {result['sqlite_events_per_s']:.0f}, "
              f"PostgreSQL {result['postgresql_events_per_s']:.0f}")
        print(f"{args.controllers} controllers x {args.attempts} attempts on PostgreSQL: wall / ideal "
              f"{result['wall_over_ideal']:.3f} ({result['wall_s']:.1f} s / {result['ideal_s']:.1f} s), "
              f"ledger commits/s {result['commits_per_s']:.1f}, PostgreSQL CPU {result['postgres_cpu_s']:.1f} s "
              f"({result['postgres_cpu_share']:.2f} of a core), jobs {result['job_states']}")
        if not args.no_baseline:
            pg, lite = result["one_postgresql_wall_over_ideal"], result["one_sqlite_wall_over_ideal"]
            print(f"1 controller x {args.attempts} attempts: wall / ideal on PostgreSQL {pg:.3f}, on SQLite {lite:.3f}")
    print(json.dumps(result))
    states = [v for k, v in result.items() if k.endswith("job_states")]
    return 0 if all(set(v) == {"succeeded"} for v in states) else 1


if __name__ == "__main__":
    sys.exit(main())
