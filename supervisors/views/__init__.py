"""What a person looks at: the live view of a run (live.py), the run's page (report.py), and the
controller's log file of a run (runlog.py).

What it may import: protocols, actors, and the supervision tree's plain data (budget statistics,
the Runner's events). Never a ledger backend (supervisors.ledger.db, batch, schema) nor the
command line (supervisors.cli): the command line hands a view what it reads.
"""

from actor_run.supervisors.views.live import View
from actor_run.supervisors.views.runlog import event_logger, open_run_log, run_log_path

__all__ = ["View", "event_logger", "open_run_log", "run_log_path"]
