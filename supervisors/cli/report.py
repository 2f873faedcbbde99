"""`actor-run report [RUN] [--out FILE.html]`: a run's report as one self-contained HTML page
(supervisors/views/report_page.py), from the figures the ledger recorded (views/report.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, open_reader, usage_error

HELP = "write a run's report: one HTML page with its timeline, cost by cloud and GPU, the walk and the jobs"
EXAMPLE = """example:
  actor-run report                       # the latest run, into its output folder (report-<run>.html)
  actor-run report 3f2a9c1d --out run.html
"""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("report", help=HELP, description=HELP, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", metavar="RUN", help="the run's id (default: the latest; see `actor-run runs`)")
    p.add_argument("--out", metavar="FILE.html", help="where to write it (default: report-<run>.html in the run's "
                                                      "output folder)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def cmd_report(args: argparse.Namespace) -> int:
    from actor_run.supervisors.views.report import build  # the page's makings: only for this command
    from actor_run.supervisors.views.report_page import render

    reader = open_reader(args)
    try:
        runs = reader.runs()
        if args.run is not None:
            chosen = [r for r in runs if r.id == args.run]
            if not chosen:
                return usage_error(f"RUN: no run {args.run!r} in this ledger (see `actor-run runs`)")
        else:
            chosen = sorted(runs, key=lambda r: r.started or 0.0)[-1:]
            if not chosen:
                return usage_error("RUN: this ledger holds no run yet")
        run = chosen[0]
        report = build({"id": run.id, "batch": run.batch, "out_dir": run.out_dir, "started": run.started,
                        "ended": run.ended}, reader.jobs(run.id), reader.run_events(run.id),
                       reservations=reader.reservations(run.id), owned=reader.events(run=run.id))
    finally:
        reader.close()
    out = Path(args.out) if args.out else Path(run.out_dir or ".") / f"report-{run.id}.html"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render(report, base=str(out.parent)), encoding="utf-8")
    except OSError as exc:
        return usage_error(f"--out: cannot write {out}: {exc.strerror or exc}")
    sys.stdout.write(f"{out}\n")
    return Exit.OK
