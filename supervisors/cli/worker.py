"""Many controllers, one ledger: `actor-run worker`, `actor-run run --ledger postgresql://...` and
`actor-run status --follow`.

A batch run on a shared (PostgreSQL) ledger is recorded there as queued jobs. Every worker, on any
machine, claims queued jobs up to its concurrency (FOR UPDATE SKIP LOCKED: two workers never claim
one job) and runs them; the `run` command works on its own batch too unless `--submit-only` (it
claims and adopts that run's jobs only: what it holds at its end or its Ctrl-C is canceled, and a
teammate's job must never be), shows each of them whoever runs it (shared_output.py), and returns once
every job of its batch has ended. Every `poll` seconds a worker also adopts the
unfinished jobs of owners whose lease expired, as `actor-run resume` does (reattach to what runs,
fetch what finished, rerun what is gone): a dead controller's jobs go on within its lease period
plus one poll. Clouds and their settings come from the batch (stored with each job); secrets from
each worker's own environment, never from the ledger.

Signals. A worker's first SIGTERM or Ctrl-C hands back: it takes no more jobs, lets go of those it
holds (their machines keep running; nothing more is written about them, in the ledger or their
files), closes its owner row so that the other workers adopt them at their next poll, and exits 0.
A second signal changes nothing (handing back deletes nothing and ends in a moment). With --drain
the first signal only stops it taking jobs: it finishes those it holds, then exits 0; a second one
hands them back. `actor-run run` on a shared ledger keeps the Ctrl-C of `run`: its whole batch
stops (`_cancel_everywhere`: the jobs it runs canceled and their machines deleted, the others
canceled by the workers running them, the queued ones ended), then it exits 130. SIGHUP (the
terminal it ran in closed) is taken as SIGTERM, by both.

The database. A worker started before its database waits for it, up to --ledger-wait (default the
lease); a database that goes away meanwhile is ridden out as long (ledger/core.py); a lease lost
(frozen past it, or away longer) makes the worker join again as a new owner. Other commands wait a
few seconds, then say in one line that the database cannot be reached (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import MAX_CONCURRENCY, MAX_SECONDS
from actor_run.supervisors.api.places import default_state_dir
from actor_run.supervisors.cli import batch_file
from actor_run.supervisors.cli.console import count_arg, number_arg, on_stop, signals_restored
from actor_run.supervisors.cli.runs import job_views, view_line
from actor_run.supervisors.cli.shared_output import RunOutput, printer
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.ledger.db import ENV, describe, is_url, read_failures, resolve, wait_for_server

if TYPE_CHECKING:  # the tree (trio, pykka, the clouds) loads when a worker or a shared run starts
    from actor_run.supervisors.api.handle import JobHandle
    from actor_run.supervisors.api.runner import Runner

OK, FAILED, USAGE, CANCELED, INTERRUPTED = 0, 1, 2, 3, 130  # the values of console.py's Exit
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
    w.add_argument("--concurrency", type=count_arg(1, MAX_CONCURRENCY), default=4,
                   help="jobs run at once here (default 4)")
    w.add_argument("--out", default="actor-run-out",
                   help="only for jobs whose run recorded no output folder (results go where the run said)")
    w.add_argument("--json", action="store_true", help="one event per line (JSON)")
    add_timing(w)
    w.add_argument("--state-dir", help=argparse.SUPPRESS)
    w.add_argument("--until-idle", action="store_true", help="exit once no job is queued or running anywhere")
    w.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics (the ledger's and this worker's) on 127.0.0.1:PORT/metrics")
    w.add_argument("--drain", action="store_true",
                   help="on SIGTERM or Ctrl-C, take no new job and finish the ones held here (a second signal hands "
                        "them back); without it the first signal hands them back at once")


def add_timing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease", type=number_arg(0, MAX_SECONDS, strict=True), default=60.0,
                   help="seconds an owner's lease lasts without renewal (renewed every third of it)")
    p.add_argument("--poll", type=number_arg(0, 3600, strict=True), default=5.0,
                   help="seconds between claims and adoption checks")
    p.add_argument("--ledger-wait", type=number_arg(0, MAX_SECONDS), default=None, metavar="S",
                   help="seconds the database may be away (not up yet at the start; restarting, failing over) while "
                        "the jobs go on (default: the lease)")


def _check(args: argparse.Namespace) -> None:
    if args.concurrency is not None and args.concurrency < 1:
        raise SpecError("--concurrency", f"expected int >= 1, got {args.concurrency}")
    if args.lease <= 0 or args.poll <= 0:
        raise SpecError("--lease" if args.lease <= 0 else "--poll", "expected a number of seconds > 0")
    if args.ledger_wait is not None and args.ledger_wait < 0:
        raise SpecError("--ledger-wait", "expected a number of seconds >= 0")


def _ledger_states(runner: Runner, run: str | None = None) -> dict[str, str]:
    """Job key -> state, of `run` or (keyed run/key) of every run."""
    reader = LedgerReader(runner.ledger_path)
    try:
        return reader.job_states(run)
    finally:
        reader.close()


def _ledger_outcomes(runner: Runner, run: str) -> dict[str, str]:
    """Job key -> how it stands in the ledger: succeeded, failed, canceled (failed with failure
    `canceled`), or running / queued."""
    reader = LedgerReader(runner.ledger_path)
    try:
        return {j["key"]: "canceled" if j["state"] == "failed" and j["failure"] == "canceled" else j["state"]
                for j in reader.jobs(run)}
    finally:
        reader.close()


def _unfinished(runner: Runner) -> int:
    """Jobs queued or running anywhere, but those queued that this worker cannot run (--until-idle:
    they wait for another worker, not for this one)."""
    reader = LedgerReader(runner.ledger_path)
    try:
        return reader.unfinished_jobs(but_queued=runner.cannot_run)
    finally:
        reader.close()


def _has_orphans(runner: Runner, run: str | None = None) -> bool:
    reader = LedgerReader(runner.ledger_path)
    try:
        return reader.has_orphans(me=runner.owner, run=run)
    finally:
        reader.close()


class _Signals:
    """What SIGTERM and Ctrl-C do to a worker (see the module's docstring): `hand back` (the default)
    or, with --drain, stop taking work and finish what is held here, handing it back on a second
    signal; for `actor-run run` on a shared ledger, today's Ctrl-C: cancel and delete.

    The handler only counts: it runs between two bytecodes of the main thread, wherever that thread
    is, so it takes no lock (an Event's, held by the `wait` it interrupted, is the same lock: a
    deadlock) and writes nothing (a write to stderr cut by the signal and entered again raises).
    The poll loop looks at the count every WAKE_S and says what the signals mean (`news`)."""

    WAKE_S = 0.05

    def __init__(self, *, mode: str) -> None:
        self.mode = mode  # "hand back" | "drain" | "cancel"
        self.count = 0  # signals received (only the handler writes it)
        self.told = 0  # of them, those the loop has said something about

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1

    @property
    def stop(self) -> bool:
        """Take no more work."""
        return self.count > 0

    @property
    def hand_back(self) -> bool:
        """Let go of the jobs held here: the first signal's meaning, or the second's with --drain."""
        return self.count >= {"hand back": 1, "drain": 2}.get(self.mode, 1 << 30)

    def news(self) -> None:
        """Say once, on stderr, what each signal received since the last call does."""
        while self.told < self.count:
            self.told += 1
            n = self.told
            if self.mode == "cancel":
                if n == 1:
                    sys.stderr.write("\nactor-run: stopping the run: deleting this worker's machines and "
                                     "canceling its jobs on the other workers before exiting\n")
            elif self.mode == "drain" and n == 1:
                sys.stderr.write("\nactor-run: draining: no new jobs; finishing the ones held here (signal again "
                                 "to hand them to the other workers)\n")
            elif n == (1 if self.mode == "hand back" else 2):
                sys.stderr.write("\nactor-run: handing this worker's jobs back to the other workers (their "
                                 "machines keep running)\n")
            else:
                sys.stderr.write("actor-run: already handing back; it deletes nothing and ends in a moment\n")

    def wait(self, timeout: float) -> None:
        """Until a signal comes or `timeout` passes."""
        seen, end = self.count, time.monotonic() + timeout
        while self.count == seen and (left := end - time.monotonic()) > 0:
            time.sleep(min(self.WAKE_S, left))


def serve(runner: Runner, args: argparse.Namespace, *, until: set[str] | None, run: str | None = None,
          mode: str = "hand back", signals: _Signals | None = None, metrics: Any = None,
          each_poll: Callable[[], None] | None = None) -> bool:
    """Adopt, claim and run until stopped, or (with `until`) until those jobs of `run` have ended
    in the ledger, or (with --until-idle) until nothing is queued or running anywhere. With `run`
    (`actor-run run`) only that run's jobs are claimed and adopted: a run works on its own batch,
    so its end (or its Ctrl-C) never cancels a teammate's job. Each poll:
    orphans first (every one whose machine runs it, watched at once; of those needing a machine, as
    many as the free slots or this worker's share of them, whichever is more: a dead worker's jobs
    are adopted within a poll of its lease's end even when every worker is full, and wait here for a
    slot), then queued jobs up to the free slots. A poll that cannot read the ledger (the
    database restarting) is skipped: the jobs go on. False if this controller's lease was lost
    meanwhile (it let its jobs go)."""
    from loguru import logger  # the Runner has loaded it

    signals = _Signals(mode=mode) if signals is None else signals
    mode = signals.mode
    on_stop(signals)  # SIGHUP (its terminal closed) as SIGTERM
    handles: list[JobHandle] = []
    while True:
        signals.news()
        if metrics is not None:
            metrics.poll()
        if runner.ledger.lease_lost:
            sys.stderr.write("actor-run: this worker's lease in the ledger expired (it was frozen or cut off); its "
                             "jobs went to other workers; exiting without touching them\n")
            return False
        handles = [h for h in handles if not h.done()]
        if signals.hand_back:
            began = time.monotonic()
            keys = runner.hand_back()
            sys.stderr.write(f"actor-run: handed back {len(keys)} job(s) in {time.monotonic() - began:.1f} s; the "
                             "other workers adopt them at their next poll\n")
            return True
        if signals.stop and (mode == "cancel" or not handles):
            break
        try:
            if not signals.stop and runner.ledger.outage_since is None:
                free = args.concurrency - len(handles)
                if _has_orphans(runner, run):
                    handles += runner.resume(run, sweep_after=False, take_runs=False, most_new=max(0, free))
                    free = args.concurrency - len(handles)
                handles += runner.claim(free, run)
            if until is not None:
                states = _ledger_states(runner, run)
                if all(states.get(k) in ENDED for k in until):
                    break
            elif getattr(args, "until_idle", False) and not handles and not _unfinished(runner):
                break
            if each_poll is not None:
                each_poll()
        except read_failures(runner.ledger.backend) as exc:  # the database is away: the writer rides it out
            logger.warning("the ledger could not be read this poll ({}); the jobs go on", str(exc).strip()[:200])
        signals.wait(args.poll)
    signals.news()
    if signals.stop and mode == "cancel":
        runner.cancel(detail="interrupted")
    return True


def cmd_worker(args: argparse.Namespace) -> int:
    """A worker until stopped (or idle). A lease lost (the process frozen past it, or the database
    away longer than --ledger-wait) ends this owner, whose jobs go to the adopters; the worker then
    joins again as a new owner, which adopts whatever is orphaned then (its old jobs included, if
    nobody took them). Stopped by a signal meanwhile, it exits 1."""
    try:
        _check(args)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return USAGE
    signals = _Signals(mode="drain" if args.drain else "hand back")
    metrics, server = None, None
    if args.metrics_port is not None:
        if not 0 < args.metrics_port <= 65535:
            sys.stderr.write(f"actor-run: --metrics-port: expected 1-65535, got {args.metrics_port}\n")
            return USAGE
        from actor_run.supervisors.views.metrics import start_worker_metrics

        metrics, server = start_worker_metrics(resolve(args.ledger, Path(args.state_dir)), "127.0.0.1",
                                               args.metrics_port)
    try:
        return _work(args, signals, metrics)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _work(args: argparse.Namespace, signals: _Signals, metrics: Any) -> int:
    from actor_run.supervisors.api.runner import Runner  # the tree: only when a worker starts

    while True:
        try:
            wait_for_ledger(args)  # a worker may start before its database: it waits, up to --ledger-wait
            runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir,
                            concurrency=args.concurrency, lease_s=args.lease, sweep_on_start=False,
                            config=args.config, outage_s=_wait_s(args))
        except SpecError as exc:
            sys.stderr.write(f"actor-run: {exc}\n")
            return USAGE
        with signals_restored(), runner:
            try:
                runner.check_settings()  # a team budget the settings name and the ledger lacks: before any claim
            except SpecError as exc:
                sys.stderr.write(f"actor-run: {exc}\n")
                return USAGE
            runner.subscribe(printer(args.json, runner.run_of))
            if metrics is not None:
                metrics.runner = runner
            kept = serve(runner, args, until=None, signals=signals, metrics=metrics)
        if kept:
            return OK
        if signals.stop:
            return FAILED
        sys.stderr.write("actor-run: joining again as a new worker (it adopts what is orphaned now)\n")


def cmd_run_shared(args: argparse.Namespace) -> int:
    """`actor-run run` on a shared ledger: queue the batch, then (unless --submit-only) work on it
    with the other workers until every job of it has ended; the exit code is the batch's."""
    try:
        _check(args)
        batch = batch_file.load(args)
        wait_for_ledger(args)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return USAGE
    from actor_run.supervisors.api.runner import Runner  # the tree: only when the batch is queued

    jobs = batch.jobs()
    args.concurrency = args.concurrency or batch.spec.policy.concurrency
    runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir, concurrency=args.concurrency,
                    lease_s=args.lease, sweep_on_start=False, batch=batch_file.label(args, batch),
                    config=args.config, outage_s=_wait_s(args))
    try:
        with signals_restored(), runner:
            for job in jobs:
                runner.check(job)  # every job checked before any is queued
            run = runner.start_run()
            for job in jobs:
                runner.enqueue(job)
            runner.ledger.flush()
            if args.submit_only:
                runner.keep_run_open()  # the workers' now: its last job ends it, not this exit
                print(f"run {run}: queued {len(jobs)} job(s) for workers; follow them with: "
                      f"actor-run status --run {run} --follow{_ledger_hint(args)}")
                return OK
            print(f"run {run}: {len(jobs)} job(s) queued, working on them with every worker\n"
                  f"controller pid {os.getpid()}; to stop it from another terminal: actor-run cancel {run}"
                  f"{_ledger_hint(args)}", file=sys.stderr if args.json else sys.stdout, flush=True)
            output = RunOutput(runner, run, json_mode=args.json)
            runner.subscribe(output.event)
            signals = _Signals(mode="cancel")
            if not serve(runner, args, until={j.key for j in jobs}, run=run, signals=signals, each_poll=output.poll):
                return FAILED  # its lease expired: the other workers finish the batch
            if signals.stop:
                try:
                    _cancel_everywhere(args, runner, run, signals)
                except read_failures(runner.ledger.backend) as exc:  # the database away: its own machines still go
                    sys.stderr.write(f"actor-run: the ledger could not be reached to stop the batch's other jobs "
                                     f"({str(exc).strip()[:200]}); stop them with: actor-run cancel {run}"
                                     f"{_ledger_hint(args)}\n")
            with contextlib.suppress(*read_failures(runner.ledger.backend)):
                output.finish([j.key for j in jobs])
            if signals.stop:
                return INTERRUPTED  # once its machines are deleted (the Runner's close)
            outcomes = _ledger_outcomes(runner, run)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return USAGE
    ended = [outcomes.get(j.key, "") for j in jobs]
    if any(o not in ("succeeded", "failed", "canceled") for o in ended):
        return INTERRUPTED
    return OK if set(ended) <= {"succeeded"} else FAILED if "failed" in ended else CANCELED


CANCEL_WAIT_S = 120.0  # how long a stopped run waits for the other workers to stop its jobs (cancel's --wait)


def _cancel_everywhere(args: argparse.Namespace, runner: Runner, run: str, signals: _Signals) -> None:
    """A shared run's Ctrl-C, SIGTERM or SIGHUP: its whole batch stops, not only the jobs this process
    runs (those it has cancelled already). As `actor-run cancel RUN`: its queued jobs end before any
    worker claims them, the workers running the others are asked to cancel them (their machines
    deleted), and it waits for them (bounded; a second signal stops waiting)."""
    from actor_run.supervisors.cli.cancel import cancel_target, wait_ended

    def say(line: str) -> None:
        sys.stderr.write(f"actor-run: {line}\n")

    cancel_target(args, run, run=run, say=say)
    others = [j for j in args._owned if j["owner"] != runner.owner]
    if others:
        say(f"waiting up to {CANCEL_WAIT_S:.0f} s for the other workers to stop {len(others)} job(s) "
            "(signal again not to wait)")
        wait_ended(args, others, CANCEL_WAIT_S, say=say, run=run, give_up=lambda: signals.count > 1)


def cmd_follow(args: argparse.Namespace) -> int:
    """`actor-run status [--run ID] --follow`: one line per job of the run (default: the latest)
    whose state changes, whoever runs it, until none is queued or running; the exit code says
    whether every job succeeded."""
    reader = LedgerReader(resolve(args.ledger, _state_dir(args)), read_only=True,
                          missing_ok=not (args.ledger or os.environ.get(ENV)))
    seen: dict[str, tuple[str, str, str]] = {}  # job key -> (state, owner, what status shows): a change is a line
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
            try:
                jobs = reader.jobs(run)
                views = {v.key: v for v in job_views(reader, run, jobs, time.time())}
            except read_failures(reader.backend) as exc:  # the database restarting: look again
                # loguru (asyncio with it: about 0.1 s of CPU) only then; configure_logging sets it up as it loads
                from loguru import logger

                logger.warning("the ledger could not be read ({}); trying again", str(exc).strip()[:200])
                time.sleep(args.poll)
                continue
            for j in jobs:
                v = views[j["key"]]
                before = seen.get(j["key"])
                # what status shows but the cost (it moves every poll), and who runs it
                now = (j["state"], j["owner"], f"{v.state} {v.place} {v.stage}")
                if before != now:
                    seen[j["key"]] = now
                    # the same state under another owner: a worker adopted it (its owner stopped or died)
                    adopted = before[1] if before is not None and before[0] == j["state"] == "running" \
                        and before[1] != j["owner"] else None
                    if args.json:
                        d = {k: v for k, v in j.items() if k != "spec"}
                        d.update({"now": v.state, "place": v.place, "stage": v.stage, "usd_now": v.usd})
                        if adopted:
                            d["adopted_from"] = adopted
                        sys.stdout.write(msgspec.json.encode(d).decode() + "\n")
                    else:
                        tail = f" adopted from {str(adopted)[:8]}" if adopted else ""
                        print(f"{view_line(v)}  owner {str(j['owner'])[:8]}{tail}", flush=True)
            if not any(j["state"] in ("queued", "running") for j in jobs):
                return OK if all(j["state"] == "succeeded" for j in jobs) else FAILED
            time.sleep(args.poll)
    finally:
        reader.close()


READ_COMMAND_WAIT_S = 5.0  # how long a command that only reads waits for a shared ledger's database


def wait_for_ledger(args: argparse.Namespace) -> None:
    """Before a command on a shared ledger: its database answers. `worker` and `run` wait for it
    up to --ledger-wait (default the lease: a worker may start before its database); the others a
    few seconds. SpecError for a URL that cannot be one (exit 2), LedgerError when not reached (1)."""
    if not hasattr(args, "ledger"):
        return
    url = str(resolve(args.ledger, _state_dir(args)))
    wait = _wait_s(args) if args.command in ("worker", "run") else READ_COMMAND_WAIT_S
    wait_for_server(url, wait)


def _wait_s(args: argparse.Namespace) -> float:
    """--ledger-wait, else the lease: past it the lease has run out anyway."""
    return float(args.ledger_wait) if getattr(args, "ledger_wait", None) is not None else float(args.lease)


def _ledger_hint(args: argparse.Namespace) -> str:
    """How the hint names the ledger: --ledger as given when it holds no password; else the
    environment variable (a password stays out of the terminal's history and of `ps`)."""
    if not args.ledger:
        return ""  # it came from $ACTOR_RUN_LEDGER (or is the default file): the same next time
    if describe(args.ledger) != args.ledger:
        return f" (with {ENV} set to the ledger's URL)"
    return f" --ledger {shlex.quote(args.ledger)}"


def _state_dir(args: argparse.Namespace) -> Path:
    state_dir = getattr(args, "state_dir", None)
    return Path(state_dir) if state_dir else default_state_dir()
