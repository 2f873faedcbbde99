"""`actor-run budget set NAME --usd N --per month|week|total`, `budget show [NAME]`, `budget clear NAME`:
team budgets across runs (ledger/team.py). A batch draws on one with `budget = "NAME"` in its
`[policy]`; every reservation of every run and worker that names it counts against it, and one that
would pass it is refused (the job walks on, then ends `budget`). Meant for a shared PostgreSQL
ledger; an SQLite ledger holds them too (one computer's runs).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Any

import msgspec

from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, ledger_path, open_reader, usage_error

EXAMPLE = """examples:
  actor-run budget set team-a --usd 500 --per month
  actor-run budget show
  actor-run cost --all --by budget
  actor-run budget clear team-a
"""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("budget", help="team budgets across runs: set, show, clear", epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", required=True)
    how = {"epilog": EXAMPLE, "formatter_class": argparse.RawDescriptionHelpFormatter}
    s = verbs.add_parser("set", help="set (or change) a team budget", **how)
    s.add_argument("name", help="the budget's name (letters, digits, . _ -), as batches name it in policy.budget")
    s.add_argument("--usd", type=float, required=True, help="the limit in dollars")
    s.add_argument("--per", choices=("month", "week", "total"), default="month",
                   help="the period the limit is for (calendar month or ISO week, UTC; total: ever)")
    show = verbs.add_parser("show", help="every team budget (or NAME): limit, spent this period, reserved, left",
                            **how)
    show.add_argument("name", nargs="?", help="one budget (default: every one)")
    show.add_argument("--json", action="store_true", help="one JSON object per budget")
    c = verbs.add_parser("clear", help="remove a team budget (what it spent stays in the ledger)", **how)
    c.add_argument("name", help="the budget to remove")
    for v in (s, show, c):
        v.add_argument("--ledger", help=LEDGER_HELP)
        v.add_argument("--state-dir", help=argparse.SUPPRESS)


def cmd_budget(args: argparse.Namespace) -> int:
    from actor_run.supervisors.ledger import team

    name: str | None = getattr(args, "name", None)
    if name is not None and not NAME.fullmatch(name):
        return usage_error(f"budget: NAME: expected letters, digits, . _ - (at most 64), got {name!r}")
    reader = open_reader(args)  # the ledger exists and is at this version before anything is written
    reader.close()
    location = ledger_path(args)
    if args.verb in ("set", "clear") and name is None:
        return usage_error("budget: NAME is required")
    if args.verb == "set":
        assert name is not None
        if not math.isfinite(args.usd) or args.usd < 0:
            return usage_error(f"budget: --usd: expected a finite number >= 0, got {args.usd}")
        team.set_budget(location, name, args.usd, args.per)
        print(f"budget {name}: ${args.usd:.2f} per {args.per}")
        return Exit.OK
    if args.verb == "clear":
        assert name is not None
        if not team.clear_budget(location, name):
            return usage_error(f"budget: no budget {name!r} in the ledger")
        print(f"budget {name}: cleared")
        return Exit.OK
    found = [b for b in team.budgets(location) if name is None or b.name == name]
    if name is not None and not found:
        return usage_error(f"budget: no budget {name!r} in the ledger")
    for b in found:
        left = b.left_usd
        if args.json:
            sys.stdout.write(msgspec.json.encode({**msgspec.structs.asdict(b), "left_usd": left}).decode() + "\n")
        else:
            print(f"{b.name:<20} ${b.usd:>10.2f} per {b.per:<5}  spent ${b.spent_usd:.4f}  reserved "
                  f"${b.reserved_usd:.4f}  left ${left:.4f}")
    if not found and not args.json:
        print("no team budget (actor-run budget set NAME --usd N --per month)")
    return Exit.OK


__all__ = ["add_parser", "cmd_budget"]
