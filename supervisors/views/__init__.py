"""What a person looks at: the live view of a run (live.py, its rows in rows.py, what fits the
terminal in fit.py, the log's warnings folded into it in log_warnings.py, the summary after the
batch in summary.py, drawn off a terminal without rich by plain.py), the run's page (its figures
gathered from the ledger's rows in report.py, the HTML page in report_page.py), and the
controller's log file of a run (runlog.py).

What it may import: protocols, actors, and the supervision tree's plain data (budget statistics,
the Runner's events). Never a ledger backend (supervisors.ledger.db, txn, schema) nor the
command line (supervisors.cli): the command line hands a view what it reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actor_run.protocols import lazy

if TYPE_CHECKING:  # what a type checker reads; at run time each name loads on first use (PEP 562)
    from actor_run.supervisors.views.live import View
    from actor_run.supervisors.views.runlog import event_logger, open_run_log, run_log_path

# public name -> the module it lives in. The live view (rich) loads only
# where a run is watched: `actor-run runs` needs run_log_path alone.
_WHERE = {
    "View": "actor_run.supervisors.views.live",
    "event_logger": "actor_run.supervisors.views.runlog",
    "open_run_log": "actor_run.supervisors.views.runlog",
    "run_log_path": "actor_run.supervisors.views.runlog",
}

if not TYPE_CHECKING:  # hidden from mypy, which then still flags a name this package does not export
    __getattr__, __dir__ = lazy.exports(globals(), _WHERE)


__all__ = ["View", "event_logger", "open_run_log", "run_log_path"]
