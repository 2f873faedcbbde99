"""Many controllers, one ledger: `actor-run worker`, `actor-run run --ledger postgresql://...` and
`actor-run status --follow`.

A batch run on a shared (PostgreSQL) ledger is recorded there as queued jobs. Every worker, on any
machine, claims queued jobs up to its concurrency (FOR UPDATE SKIP LOCKED: two workers never claim
one job) and runs them; the `run` command is a worker too unless `--submit-only`, and returns once
every job of its batch has ended, whoever ran it. Every `poll` seconds a worker also adopts the
unfinished jobs of owners whose lease expired, as `actor-run resume` does (reattach to what runs,
fetch what finished, rerun what is gone): a dead controller's jobs go on within its lease period
plus one poll. Clouds and their settings come from the batch (stored with each job); secrets from
each worker's own environment, never from the ledger.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Event, JobEnded, encode
from actor_run.supervisors.cli import oneline
from actor_run.supervisors.cli.runs import job_views, view_line
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.ledger.db import is_url, resolve
from actor_run.supervisors.runner import JobHandle, Runner, default_state_dir

OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130
ENDED = ("succeeded", "failed")


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    """What `actor-run run` takes for a shared ledger."""
    run.add_argument("--submit-only", action="store_true",
                     help="shared ledger: queue the jobs for workers and run none here")
    add_timing(run)


def shared(args: argparse.Namespace) -> bool:
    """Whether the command's ledger is a shared (PostgreSQL) one."""
    return is_url(resolve(getattr(args, "ledger", None), _state_dir(args)))


def add_worker_parser(sub: argparse._SubParsersAction[Any]) -> None:
    w = sub.add_parser(
        "worker", help="claim and run queued jobs from a shared ledger",
        epilog="example: actor-run worker --ledger postgresql://team@db.example/actor_run --concurrency 8")
    w.add_argument("--ledger", help="the shared ledger: a postgresql:// URL (or $ACTOR_RUN_LEDGER)")
    w.add_argument("--concurrency", type=int, default=4, help="jobs run at once here (default 4)")
    w.add_argument("--out", default="actor-run-out",
                   help="only for jobs whose run recorded no output folder (results go where the run said)")
    w.add_argument("--json", action="store_true", help="one event per line (JSON)")
    add_timing(w)
    w.add_argument("--state-dir", help=argparse.SUPPRESS)
    w.add_argument("--until-idle", action="store_true", help="exit once no job is queued or running anywhere")


def add_timing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease", type=float, default=60.0,
                   help="seconds an owner's lease lasts without renewal (renewed every third of it)")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between claims and adoption checks")


def _check(args: argparse.Namespace) -> None:
    if args.concurrency is not None and args.concurrency < 1:
        raise SpecError("--concurrency", f"expected int >= 1, got {args.concurrency}")
    if args.lease <= 0 or args.poll <= 0:
        raise SpecError("--lease" if args.lease <= 0 else "--poll", "expected a number of seconds > 0")


def _ledger_states(runner: Runner, run: str | None = None) -> dict[str, str]:
    """Job key -> state, of `run` or (keyed run/key) of every run."""
    reader = LedgerReader(runner.ledger_path)
    try:
        if run is not None:
            return {j["key"]: j["state"] for j in reader.jobs(run)}
        return {f"{j['run']}/{j['key']}": j["state"] for j in reader.jobs()}
    finally:
        reader.close()


def _has_orphans(runner: Runner) -> bool:
    reader = LedgerReader(runner.ledger_path)
    try:
        return reader.has_orphans(me=runner.owner)
    finally:
        reader.close()


def serve(runner: Runner, args: argparse.Namespace, *, until: set[str] | None, run: str | None = None) -> bool:
    """Claim, run and adopt until interrupted, or (with `until`) until those jobs of `run` have
    ended in the ledger, or (with --until-idle) until nothing is queued or running anywhere.
    False if this controller's lease expired meanwhile (it let its jobs go)."""
    stop = threading.Event()

    def interrupted(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            sys.stderr.write("\nactor-run: stopping; deleting this worker's machines before exiting\n")
        stop.set()

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    handles: list[JobHandle] = []
    while not stop.is_set():
        if runner.ledger.lease_lost:
            sys.stderr.write("actor-run: this worker's lease in the ledger expired (it was frozen or cut off); its "
                             "jobs went to other workers; exiting without touching them\n")
            return False
        running = [h for h in handles if not h.done()]
        handles = running
        handles += runner.claim(args.concurrency - len(running))
        if _has_orphans(runner):
            handles += runner.resume(sweep_after=False, take_runs=False)
        if until is not None or getattr(args, "until_idle", False):
            states = _ledger_states(runner, run if until is not None else None)
            if until is not None and all(states.get(k) in ENDED for k in until):
                break
            if until is None and not any(s in ("queued", "running") for s in states.values()) and not handles:
                break
        stop.wait(args.poll)
    if stop.is_set():
        runner.cancel(detail="interrupted")
    return True


def _printer(json_mode: bool) -> object:
    def show(e: Event) -> None:
        if json_mode:
            sys.stdout.write(encode(e).decode() + "\n")
            sys.stdout.flush()
        elif isinstance(e, JobEnded):
            tail = f" {e.failure}: {e.detail}" if e.failure else ""
            print(f"{e.job}/seed-{e.seed:<6} {e.outcome:<10} attempts {e.attempts} ${e.usd:.4f}{tail}", flush=True)

    return show


def cmd_worker(args: argparse.Namespace) -> int:
    try:
        _check(args)
        runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir,
                        concurrency=args.concurrency, lease_s=args.lease, sweep_on_start=False, config=args.config)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return USAGE
    with runner:
        runner.subscribe(_printer(args.json))  # type: ignore[arg-type]
        kept = serve(runner, args, until=None)
    return OK if kept else FAILED


def cmd_run_shared(args: argparse.Namespace) -> int:
    """`actor-run run` on a shared ledger: queue the batch, then (unless --submit-only) work on it
    with the other workers until every job of it has ended; the exit code is the batch's."""
    try:
        _check(args)
        batch = oneline.load(args)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return USAGE
    jobs = batch.jobs()
    args.concurrency = args.concurrency or batch.spec.policy.concurrency
    runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir, concurrency=args.concurrency,
                    lease_s=args.lease, sweep_on_start=False, batch=oneline.label(args, batch),
                    config=args.config)
    try:
        with runner:
            for job in jobs:
                runner.check(job)  # every job checked before any is queued
            run = runner.start_run()
            for job in jobs:
                runner.enqueue(job)
            runner.ledger.flush()
            if args.submit_only:
                print(f"run {run}: queued {len(jobs)} job(s) for workers; follow them with: "
                      f"actor-run status --run {run} --follow")
                return OK
            print(f"run {run}: {len(jobs)} job(s) queued, working on them with every worker\n"
                  f"controller pid {os.getpid()}; to stop it from another terminal: actor-run cancel {run}"
                  " --ledger <the same ledger>", file=sys.stderr if args.json else sys.stdout, flush=True)
            runner.subscribe(_printer(args.json))  # type: ignore[arg-type]
            if not serve(runner, args, until={j.key for j in jobs}, run=run):
                return FAILED  # its lease expired: the other workers finish the batch
            states = _ledger_states(runner, run)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return USAGE
    keys = [j.key for j in jobs]
    if any(states.get(k) not in ENDED for k in keys):
        return INTERRUPTED
    return OK if all(states.get(k) == "succeeded" for k in keys) else FAILED


def cmd_follow(args: argparse.Namespace) -> int:
    """`actor-run status [--run ID] --follow`: one line per job of the run (default: the latest)
    whose state changes, whoever runs it, until none is queued or running; the exit code says
    whether every job succeeded."""
    reader = LedgerReader(resolve(args.ledger, _state_dir(args)))
    seen: dict[str, str] = {}
    try:
        run = args.run
        if run is None:
            runs = reader.runs()
            if not runs:
                print("no run in the ledger")
                return OK
            run = runs[-1].id
        elif reader.run(run) is None:
            sys.stderr.write(f"actor-run: --run: no run {run!r} in this ledger (see `actor-run runs`)\n")
            return USAGE
        while True:
            jobs = reader.jobs(run)
            views = {v.key: v for v in job_views(reader, run, jobs, time.time())}
            for j in jobs:
                v = views[j["key"]]
                now = f"{v.state} {v.place} {v.stage}"  # what status shows, but the cost (it moves every poll)
                if seen.get(j["key"]) != now:
                    seen[j["key"]] = now
                    if args.json:
                        d = {k: v for k, v in j.items() if k != "spec"}
                        d.update({"now": v.state, "place": v.place, "stage": v.stage, "usd_now": v.usd})
                        sys.stdout.write(msgspec.json.encode(d).decode() + "\n")
                    else:
                        print(f"{view_line(v)}  owner {str(j['owner'])[:8]}", flush=True)
            if not any(j["state"] in ("queued", "running") for j in jobs):
                return OK if all(j["state"] == "succeeded" for j in jobs) else FAILED
            time.sleep(args.poll)
    finally:
        reader.close()


def _state_dir(args: argparse.Namespace) -> Path:
    state_dir = getattr(args, "state_dir", None)
    return Path(state_dir) if state_dir else default_state_dir()
