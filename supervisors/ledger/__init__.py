"""The ledger: the durable record of owners, runs, jobs, attempts, machines, events and money, in
an SQLite file (one controller) or a PostgreSQL database (many `actor-run worker` processes sharing
it: claims, leases, fencing tokens).

    core.py        the writer's machinery: its thread, batched commits, fencing, riding out outages
    queue.py       what it is handed: the write queue, Waiter (durable when?), FileWrite (fenced files)
    writer.py      Ledger: core.py with the records of each kind ...
    runs.py          ... runs and jobs (claims with fencing tokens)
    attempts.py      ... attempts and events
    machines.py      ... owners (leases, liveness), machines, clouds
    money.py         ... reservations and charges
    reader.py      LedgerReader and its rows (MachineRow, RunRow)
    db.py          the backends: SQLite, PostgreSQL (pools, SQL translation); a --ledger's meaning
    batch.py       how a batch of writes runs (multi-row statements)
    schema.py      the tables and their numbered upgrade steps
    sweep.py       which orphaned machines a sweep deletes, and the sweep itself
    resume.py      what a resume takes over from a dead controller

What it may import: protocols, actors, and its own modules. Never the command line
(supervisors.cli), what a person looks at (supervisors.views), nor the supervision tree
(supervisors.runner, batch, job, ...): they use the ledger, it knows nothing of them. Inside the
package, modules import each other by module, never through this file.
"""

from actor_run.supervisors.ledger.core import LedgerCore
from actor_run.supervisors.ledger.db import LedgerError, LedgerUnusable
from actor_run.supervisors.ledger.machines import OwnerRow, owner_is_alive, process_start_time
from actor_run.supervisors.ledger.queue import StaleClaim, Waiter
from actor_run.supervisors.ledger.reader import LedgerReader, MachineRow, RunRow
from actor_run.supervisors.ledger.runs import Claimed
from actor_run.supervisors.ledger.writer import Ledger

__all__ = [
    "Claimed",
    "Ledger",
    "LedgerCore",
    "LedgerError",
    "LedgerReader",
    "LedgerUnusable",
    "MachineRow",
    "OwnerRow",
    "RunRow",
    "StaleClaim",
    "Waiter",
    "owner_is_alive",
    "process_start_time",
]
