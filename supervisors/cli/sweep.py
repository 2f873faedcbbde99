"""`actor-run sweep`: delete the machines a sweep can prove abandoned (sweep.py), list the rest
(foreign ones with when their deadline takes them), or, with `--owner ID`, treat that owner as
dead after showing what that deletes. It asks every cloud it can: each the ledger has seen, each
in the user's config (`--config`), and each a batch file names (`--batch`), with a fresh ledger too.
Cache volumes (`ar-cache-*`, a candidate's `cache`) are listed after the machines, never deleted but
with `--caches` (cli/caches.py)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from actor_run.protocols.specs import MAX_SECONDS
from actor_run.supervisors.cli import batch_file
from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, number_arg, usage_error

if TYPE_CHECKING:  # the sweep's machinery (trio, the clouds, the tree) loads when it runs
    from actor_run.supervisors.ledger.sweep import SweepAction

HELP = "delete machines nobody needs: owner dead, past deadline + grace, or heartbeat stopped on the host"
EXAMPLE = """example:
  actor-run sweep --dry-run              # what would go, and whose machines stay (foreign owners)
  actor-run sweep --owner 1a2b3c4d       # that controller is dead: delete its machines too
  actor-run sweep --batch seeds.toml     # the clouds that batch names too (its own settings)
  actor-run sweep --caches               # and delete the cache volumes (runs keep them)
"""
_OWNER = re.compile(r"^[0-9a-f]{8}([0-9a-f]{24})?$")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("sweep", help=HELP, description=HELP, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="one action per line (JSON)")
    p.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    p.add_argument("--owner", action="append", default=[], metavar="ID",
                   help="treat this owner (8 hex digits as machine names show, or the full id) as dead")
    p.add_argument("--grace", type=number_arg(0, MAX_SECONDS), default=600.0,
                   help="seconds past a deadline before any owner's machine goes")
    p.add_argument("--batch", metavar="FILE", help="also ask the clouds this batch file names, with its settings")
    p.add_argument("--caches", action="store_true", help="also delete the cache volumes (ar-cache-*): a run never does")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _line(a: SweepAction) -> str:
    verb = {"delete": "would delete", "close": "would close"}.get(a.action, a.action)
    tail = f": {a.detail}" if a.detail else ""
    if a.action == "keep" and a.reason == "foreign owner":
        tail = f" {a.owner[:8]}, deadline {_when(a.deadline)}, deleted from {_when(a.expires)} whoever owns it"
    return f"{a.machine:<52} {a.cloud:<6} {verb:<13} {a.reason}{tail}"


def _print(actions: list[SweepAction], *, json_mode: bool, dry_run: bool) -> bool:
    failed = False
    for a in actions:
        if json_mode:
            sys.stdout.write(msgspec.json.encode(a).decode() + "\n")
        elif a.action != "keep" or not dry_run or a.reason == "foreign owner":
            print(_line(a))
        if a.action == "failed":
            failed = True
            if a.machine == "*":
                sys.stderr.write(f"actor-run: could not list the machines on {a.cloud} ({a.detail}): any of ours there "
                                 "were not swept; run the sweep again once it answers\n")
            else:
                sys.stderr.write(f"actor-run: could not delete {a.machine} on {a.cloud}: {a.detail}; it stays in the "
                                 "ledger for the next sweep; delete it by hand in the provider's console if this "
                                 "persists\n")
    if not json_mode and not any(a.action != "keep" for a in actions):
        print("nothing to sweep")
    return failed


def cmd_sweep(args: argparse.Namespace) -> int:
    from actor_run.supervisors.api.runner import Runner  # the tree (trio, pykka, the clouds): only when it runs
    from actor_run.supervisors.cli.caches import print_caches, sweep_caches

    for owner in args.owner:
        if not _OWNER.match(owner):
            return usage_error(f"--owner: expected 8 or 32 hex digits (as machine names and `sweep` show), "
                               f"got {owner!r}")
    jobs = batch_file.load_file(args.batch).jobs()[:1] if args.batch else []  # one job names its clouds
    runner = Runner(ledger=args.ledger, state_dir=args.state_dir, sweep_on_start=False, sweep_grace_s=args.grace,
                    config=args.config, register=not args.dry_run)  # a dry run leaves no owner row behind
    with runner:
        for job in jobs:
            runner.check(job)  # builds the batch's clouds (its merged settings): the sweep asks them too
        if args.owner and not args.dry_run:
            # a person's decision: show what it takes before anything goes
            plan = runner.sweep(dry_run=True, owners_dead=args.owner)
            doomed = [a for a in plan if a.action in ("delete", "close")]
            if not args.json:
                print(f"treating {', '.join(args.owner)} as dead: {len(doomed)} machine(s) to delete or close")
                for a in doomed:
                    print(_line(a))
        actions = runner.sweep(dry_run=args.dry_run, owners_dead=args.owner)
        caches = sweep_caches(runner, delete=args.caches, dry_run=args.dry_run)
    failed = _print(actions, json_mode=args.json, dry_run=args.dry_run)
    failed = print_caches(caches, runner.ledger_path, json_mode=args.json) or failed
    return Exit.FAILED if failed else Exit.OK
