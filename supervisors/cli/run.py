"""`actor-run run BATCH.toml`: a new run of a batch file, drawn live (or one JSON event a line),
with this process as its controller, or with --detach a controller in the background (detach.py);
a postgresql:// ledger's run is worker.py's."""

from __future__ import annotations

import argparse
import collections
import os
import sys

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Event, Released
from actor_run.protocols.specs import MAX_CONCURRENCY
from actor_run.supervisors.cli import batch_file, detach
from actor_run.supervisors.cli import plan as cmd_plan
from actor_run.supervisors.cli.console import (
    LEDGER_HELP,
    Exit,
    Interrupts,
    count_arg,
    exit_of,
    on_stop,
    signals_restored,
    stderr_lines_off,
    watch,
    where_state_lives,
)
from actor_run.supervisors.ledger.db import describe
from actor_run.supervisors.views.runlog import event_logger, open_run_log

RUN_EXAMPLE = """examples:
  actor-run run examples/seeds.toml --out results/
  actor-run run examples/sim.toml --detach     # the controller in the background: close the terminal
  actor-run run --gpu H100 --cloud runpod --seeds 1-8 --timeout 2h -- python train.py --seed {seed}
  actor-run run --gpu H100 --seeds 1-8 --print-batch -- python train.py --seed {seed} > train.toml
  actor-run run examples/sim.toml --ledger postgresql://team@db.example/actor_run --submit-only
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    run: argparse.ArgumentParser = sub.add_parser(
        "run", help="run a batch file (a new run: its id is printed first)",
        epilog=RUN_EXAMPLE + "\n" + where_state_lives(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("batch", nargs="?", help="a batch file (TOML); or none, and a command after --")
    run.add_argument("--json", action="store_true", help="one event per line (JSON), each with its run")
    run.add_argument("--concurrency", type=count_arg(1, MAX_CONCURRENCY),
                     help="jobs at once (default: the batch's policy.concurrency)")
    run.add_argument("--ledger", help=LEDGER_HELP)
    run.add_argument("--out", default="actor-run-out", help="where results go (recorded with the run)")
    run.add_argument("--state-dir", help=argparse.SUPPRESS)
    detach.add_flags(run)
    batch_file.add_flags(run)
    return run


def cmd_print_batch(args: argparse.Namespace) -> int:
    """`run ... --print-batch`: the batch the flags make, as a TOML file, checked first."""
    try:
        batch_file.load(args)
        raw, _ = batch_file.batch_table(args)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    sys.stdout.write(batch_file.toml_text(raw))
    return Exit.OK


def cmd_run(args: argparse.Namespace) -> int:
    """A new run with this process as its controller; with --detach, the controller started in the
    background (detach.py) and this process back to the shell; with --detached-run, this process is
    that controller (no question, no terminal, SIGHUP ignored). SIGINT, SIGTERM and SIGHUP (the
    terminal closed) cancel every job and delete every machine, then exit 130."""
    controller = detach.is_controller(args)
    word = detach.become_controller(args) if controller else None
    try:
        batch = batch_file.load(args)
        if args.concurrency is not None and args.concurrency < 1:
            raise SpecError("--concurrency", f"expected int >= 1, got {args.concurrency}")
    except SpecError as exc:
        if word is not None:
            word.say("usage", str(exc))
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    if not controller and not cmd_plan.confirm(args, batch):
        sys.stderr.write("actor-run: not started\n")
        return Exit.USAGE
    if args.detach and not controller:
        return detach.start(args, batch)

    from loguru import logger

    from actor_run.supervisors.api.notify import Notifier
    from actor_run.supervisors.api.runner import Runner  # the tree (trio, pykka, the clouds): only when it runs

    jobs = batch.jobs()
    concurrency = args.concurrency or batch.spec.policy.concurrency
    events: collections.deque[Event] = collections.deque()
    runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir, concurrency=concurrency,
                    budget_usd=batch.spec.policy.budget_usd, batch=batch_file.label(args, batch),
                    config=args.config, run=args.detached_run)
    interrupts = Interrupts(runner)
    unconfirmed: list[Released] = []
    log: int | None = None
    notifier: Notifier | None = None
    try:
        with signals_restored(), runner:  # the handlers stay ours until its machines are deleted
            for job in jobs:
                runner.check(job)  # every job checked before any starts
            run = runner.start_run()
            log = open_run_log(runner.state_dir, run)
            runner.subscribe(event_logger(runner.run_of))
            # the run's id first (on stderr with --json: stdout is one event per line, each naming it)
            print(f"run {run}: {len(jobs)} job(s), results in {runner.out_dir}\n"
                  f"controller pid {os.getpid()}; to stop it from another terminal: actor-run cancel {run}"
                  + (f" --ledger {describe(args.ledger)}" if args.ledger else ""),
                  file=sys.stderr if args.json else sys.stdout, flush=True)
            runner.subscribe(events.append)
            notifier = Notifier(runner.config.notify, run=run)
            runner.subscribe(notifier.event)
            on_stop(interrupts, hangup=not controller)
            keys: list[str] = []
            for j in jobs:  # 100,000 seeds take minutes to submit: a Ctrl-C meanwhile submits no more
                if interrupts.count:
                    sys.stderr.write(f"actor-run: {len(jobs) - len(keys)} job(s) not submitted (interrupted)\n")
                    break
                keys.append(runner.submit(j).key)
            if word is not None:
                stderr_lines_off()  # its stderr is the run's log, which has them already
                word.say("ok", run)
            ended = watch(runner, keys, events, json_mode=args.json, unconfirmed=unconfirmed,
                          budget_usd=batch.spec.policy.budget_usd)
            notifier.run_ended(succeeded=sum(e.outcome == "succeeded" for e in ended),
                               failed=sum(e.outcome != "succeeded" and e.failure != "canceled" for e in ended),
                               canceled=sum(e.failure == "canceled" for e in ended), usd=sum(e.usd for e in ended))
    except SpecError as exc:
        if word is not None:
            word.say("usage", str(exc))
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    finally:
        if notifier is not None:
            notifier.close()  # what is queued is delivered (bounded), then its thread ends
        if log is not None:
            logger.remove(log)
    if interrupts.count:
        return Exit.INTERRUPTED
    code = exit_of(ended)
    if unconfirmed and code != Exit.FAILED:
        return Exit.UNCONFIRMED  # a machine may still be running (and billing): not a clean success
    return code
