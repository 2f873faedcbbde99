"""`actor-run cancel RUN | JOB | JOB/SEED [--run ID] [--ledger ...]`: stop jobs from another terminal.

The request goes into the ledger (ledger/cancels.py); the controller that runs each job (an
`actor-run run` on SQLite, any worker on PostgreSQL) reads it within a poll (a second), stops the
attempt, deletes the machine and ends the job `canceled`; this command waits for that (bounded by
`--wait`). A job whose controller is dead is ended here, and its machines are deleted as the sweep
would (their owner proven dead); a queued job is ended before any worker claims it.

TARGET: a run id (every unfinished job of it), a job name (every unfinished seed of it, of every
run or of `--run`), or `name/seed` (`train/3` or `train/seed-3`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from actor_run.protocols.specs import MAX_SECONDS, job_key
from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, ledger_path, number_arg, open_reader, usage_error
from actor_run.supervisors.ledger import owner_is_alive
from actor_run.supervisors.ledger.cancels import end_unowned, request_cancels

ENDED = ("succeeded", "failed")
DETAIL = "canceled with actor-run cancel"
EXAMPLE = """examples:
  actor-run cancel 1a2b3c4d          # every unfinished job of that run
  actor-run cancel train             # every unfinished seed of the job named train
  actor-run cancel train/3           # one seed (train/seed-3 also works)
"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("cancel", help="stop a run, a job or one seed from another terminal (its machine deleted)",
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="RUN|JOB|JOB/SEED", help="a run id, a job name, or name/seed")
    p.add_argument("--run", help="only jobs of this run")
    p.add_argument("--wait", type=number_arg(0, MAX_SECONDS), default=120.0, metavar="S",
                   help="seconds to wait for the controllers to stop the jobs (default 120; 0: do not wait)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def _matches(target: str, jobs: list[dict[str, Any]], runs: set[str]) -> list[dict[str, Any]] | None:
    """The jobs TARGET names (None: it names nothing in the ledger)."""
    if "/" in target:
        name, _, seed = target.partition("/")
        m = re.fullmatch(r"(?:seed-)?(-?\d+)", seed)
        if not m:
            return None
        key = job_key(name, int(m.group(1)))
        found = [j for j in jobs if j["key"] == key]
    elif target in runs:
        found = [j for j in jobs if j["run"] == target]
    else:
        found = [j for j in jobs if j["name"] == target]
    return found or None


class NothingNamed(LookupError):
    """TARGET names no run, job or job/seed in the ledger."""


def cancel_target(args: argparse.Namespace, target: str, *, run: str | None = None,
                  say: Any = None) -> list[str]:
    """Cancel what TARGET names (of `run`, or of every run): ask the controllers running its jobs,
    end those nobody runs (their machines deleted as the sweep would). The lines said, in order
    (each also given to `say` as it comes); the jobs asked of live controllers are in `args`'
    `_owned` after it. Raises NothingNamed. The dashboard's cancel buttons call this too."""
    lines: list[str] = []

    def tell(line: str) -> None:
        lines.append(line)
        if say is not None:
            say(line)

    reader = open_reader(args)
    try:
        jobs = reader.jobs(run)
        runs = {r.id for r in reader.runs()}
        owners = {o.id: o for o in reader.owners()}
    finally:
        reader.close()
    found = _matches(target, jobs, runs)
    if found is None:
        raise NothingNamed(target)
    args._owned = []
    unfinished = [j for j in found if j["state"] not in ENDED]
    if not unfinished:
        states = ", ".join(sorted({f"{j['state']}" for j in found}))
        tell(f"nothing to cancel: {target} has ended ({states})")
        return lines
    now = time.time()
    alive = {o for o, row in owners.items() if owner_is_alive(row, now=now)}
    owned = [j for j in unfinished if j["state"] == "running" and j["owner"] in alive]
    unowned = [j for j in unfinished if j not in owned]
    location = ledger_path(args)
    if owned:
        request_cancels(location, [(j["run"], j["key"]) for j in owned], DETAIL)
        tell(f"asked the controller(s) of {len(owned)} job(s) to cancel them")
    if unowned:
        ended = end_unowned(location, [(j["run"], j["key"], j["name"], j["seed"], j["state"], j["owner"])
                                       for j in unowned], f"{DETAIL} (nobody was running it)")
        # a worker claimed (or adopted) it meanwhile, or it ended: its controller cancels it as any running job
        claimed = [j for j in unowned if (j["run"], j["key"]) not in ended]
        unowned = [j for j in unowned if (j["run"], j["key"]) in ended]
        if claimed:
            request_cancels(location, [(j["run"], j["key"]) for j in claimed], DETAIL)
            tell(f"asked the controller(s) of {len(claimed)} job(s) that started meanwhile to cancel them")
            owned += claimed
        dead = sorted({j["owner"] for j in unowned if j["owner"] and j["owner"] not in alive})
        if dead:  # their machines go as the sweep would: their owner is proven dead
            from actor_run.supervisors.api.runner import Runner  # the tree: only when there is a machine to delete

            runner = Runner(ledger=args.ledger, state_dir=args.state_dir, sweep_on_start=False, config=args.config)
            with runner:
                actions = runner.sweep()
            gone = [a for a in actions if a.action == "deleted"]
            tell(f"{len(gone)} machine(s) of dead controller(s) deleted")
            for a in actions:
                if a.action == "failed":
                    sys.stderr.write(f"actor-run: could not delete {a.machine} on {a.cloud}: {a.detail}; "
                                     "`actor-run sweep` tries again\n")
        for j in unowned:
            tell(f"{j['key']} (run {j['run']}): canceled (nobody was running it)")
    args._owned = owned
    return lines


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        lines = cancel_target(args, args.target, run=args.run, say=print)
    except NothingNamed:
        return usage_error(f"cancel: no run, job or job/seed {args.target!r} in the ledger"
                           + (f" (run {args.run})" if args.run else ""))
    if lines and lines[0].startswith("nothing to cancel"):
        return Exit.FAILED
    return _wait(args, args._owned)


def _wait(args: argparse.Namespace, owned: list[dict[str, Any]]) -> int:
    if not owned or args.wait <= 0:
        return Exit.OK
    return Exit.OK if wait_ended(args, owned, args.wait, say=print, run=args.run) else Exit.FAILED


def wait_ended(args: argparse.Namespace, owned: list[dict[str, Any]], wait_s: float, *, say: Any,
               run: str | None = None, give_up: Any = None) -> bool:
    """Wait up to `wait_s` (or until `give_up()`) for the jobs `owned` (their controllers asked to
    cancel them) to end, saying each end; whether they all did (else stderr says how many did not)."""
    pending = {(j["run"], j["key"]) for j in owned}
    end = time.monotonic() + wait_s
    reader = open_reader(args)
    try:
        while pending and time.monotonic() < end and not (give_up is not None and give_up()):
            for j in reader.jobs(run):
                if (j["run"], j["key"]) in pending and j["state"] in ENDED:
                    pending.discard((j["run"], j["key"]))
                    how = j["failure"] or j["state"]
                    say(f"{j['key']} (run {j['run']}): {how}" + ("" if how == "canceled" else " (it ended first)"))
            if pending:
                time.sleep(0.2)  # a person's command polling the ledger another process writes, bounded above
    finally:
        reader.close()
    if pending:
        sys.stderr.write(f"actor-run: {len(pending)} job(s) not ended after {wait_s:.0f} s; their controller "
                         "has the request and cancels them when it reads it\n")
        return False
    return True


__all__ = ["NothingNamed", "add_parser", "cancel_target", "cmd_cancel", "wait_ended"]
