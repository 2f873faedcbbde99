"""`Ledger`, the write side: the writer's machinery (core.py) with the records of each kind."""

from __future__ import annotations

from actor_run.supervisors.ledger.attempts import AttemptRecords
from actor_run.supervisors.ledger.caches import CacheRecords
from actor_run.supervisors.ledger.machines import MachineRecords
from actor_run.supervisors.ledger.money import MoneyRecords
from actor_run.supervisors.ledger.runs import RunRecords


class Ledger(RunRecords, AttemptRecords, MachineRecords, MoneyRecords, CacheRecords):
    """The write side: one thread, one connection, batched transactions.

    On a fenced backend (PostgreSQL) each transaction first reads, under a share lock, this owner's
    lease and the fencing token of every job its writes are about: writes of a job whose token is
    no longer the one this controller claimed it with, or of any job once this owner's lease has
    expired, are not made; their waiters get StaleClaim and `on_stale(keys)` is told once per job
    (on the writer thread: it must only hand the news on).

    Its records, by kind: runs and jobs (runs.py), attempts and events (attempts.py), owners,
    machines and clouds (machines.py), reservations and charges (money.py), cache volumes (caches.py)."""
