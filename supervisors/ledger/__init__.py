"""The ledger: the durable record of owners, runs, jobs, attempts, machines, events and money, in
an SQLite file (one controller) or a PostgreSQL database (many `actor-run worker` processes sharing
it: claims, leases, fencing tokens).

    core.py        the writer's machinery: its thread, batched commits, fencing, riding out outages
    queue.py       what it is handed: the write queue, Waiter (durable when?), FileWrite (fenced files)
    writer.py      Ledger: core.py with the records of each kind ...
    runs.py          ... runs and jobs (claims with fencing tokens)
    attempts.py      ... attempts and events
    machines.py      ... owners (leases), machines, clouds
    money.py         ... reservations and charges
    owners.py      an owner row and whether it is alive (what a reader needs of owners)
    reader.py      LedgerReader and its rows (MachineRow, RunRow)
    db.py          the backends: SQLite, PostgreSQL (pools, SQL translation); a --ledger's meaning
    txn.py         how one transaction of queued writes runs (multi-row statements)
    schema.py      the tables and their numbered upgrade steps
    sweep.py       which orphaned machines a sweep deletes, and the sweep itself
    resume.py      what a resume takes over from a dead controller

What it may import: protocols, actors, and its own modules. Never the command line
(supervisors.cli), what a person looks at (supervisors.views), nor the supervision tree
(supervisors.tree, supervisors.api): they use the ledger, it knows nothing of them. Inside the
package, modules import each other by module, never through this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actor_run.protocols import lazy

if TYPE_CHECKING:  # what a type checker reads; at run time each name loads on first use (PEP 562)
    from actor_run.supervisors.ledger.core import LedgerCore
    from actor_run.supervisors.ledger.db import LedgerError, LedgerUnusable
    from actor_run.supervisors.ledger.owners import OwnerRow, owner_is_alive, process_start_time
    from actor_run.supervisors.ledger.queue import StaleClaim, Waiter
    from actor_run.supervisors.ledger.reader import (
        UNCOUNTED,
        CacheRow,
        JobMoney,
        LedgerReader,
        MachineRow,
        RunRow,
        money_by_job,
    )
    from actor_run.supervisors.ledger.runs import Claimed
    from actor_run.supervisors.ledger.writer import Ledger

# public name -> the module it lives in. A reader (`actor-run status`) loads
# reader.py and db.py only: the writer's machinery brings the actors' thread pool.
_WHERE = {
    "CacheRow": "actor_run.supervisors.ledger.reader",
    "Claimed": "actor_run.supervisors.ledger.runs",
    "JobMoney": "actor_run.supervisors.ledger.reader",
    "Ledger": "actor_run.supervisors.ledger.writer",
    "LedgerCore": "actor_run.supervisors.ledger.core",
    "LedgerError": "actor_run.supervisors.ledger.db",
    "LedgerReader": "actor_run.supervisors.ledger.reader",
    "LedgerUnusable": "actor_run.supervisors.ledger.db",
    "MachineRow": "actor_run.supervisors.ledger.reader",
    "OwnerRow": "actor_run.supervisors.ledger.owners",
    "RunRow": "actor_run.supervisors.ledger.reader",
    "StaleClaim": "actor_run.supervisors.ledger.queue",
    "UNCOUNTED": "actor_run.supervisors.ledger.reader",
    "Waiter": "actor_run.supervisors.ledger.queue",
    "owner_is_alive": "actor_run.supervisors.ledger.owners",
    "money_by_job": "actor_run.supervisors.ledger.reader",
    "process_start_time": "actor_run.supervisors.ledger.owners",
}

if not TYPE_CHECKING:  # hidden from mypy, which then still flags a name this package does not export
    __getattr__, __dir__ = lazy.exports(globals(), _WHERE)


__all__ = [
    "UNCOUNTED",
    "CacheRow",
    "Claimed",
    "JobMoney",
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
    "money_by_job",
    "owner_is_alive",
    "process_start_time",
]
