"""Team budgets across runs: a named dollar limit (`actor-run budget set NAME --usd N --per
month|week|total`) that every reservation of every run and worker drawing on it counts against,
with the same rule as a batch's `budget_usd` (reserved + spent <= limit, a reservation refused
when it would break it).

Exact under concurrency: a reservation against a team budget is made in the very transaction that
reads what the budget holds, and that transaction first locks the budget's row (PostgreSQL:
`SELECT ... FOR UPDATE`; SQLite: `BEGIN IMMEDIATE` holds the whole file), so two controllers never
both take the last dollars. What a budget holds: its live reservations, plus what released ones
were charged since the period began (the calendar month or ISO week, UTC; `total`: ever).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from actor_run.supervisors.ledger.db import Conn, open_backend

PERIODS = ("month", "week", "total")


class TeamBudget(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    usd: float
    per: str
    spent_usd: float = 0.0  # charged in the current period
    reserved_usd: float = 0.0  # live reservations

    @property
    def left_usd(self) -> float:
        """What this period leaves beside what was spent and what is reserved."""
        return self.usd - self.spent_usd - self.reserved_usd


class Held(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a hold: `ok` (the reservation row is written), the team budget as it stood, and
    the batch's own (`batch`: its run's `budget_usd`, when the hold was asked to keep to it)."""

    ok: bool
    budget: TeamBudget | None  # None: no such budget (or none named)
    batch: TeamBudget | None = None

    @property
    def batch_refused(self) -> bool:
        return not self.ok and self.batch is not None and self.batch.left_usd < 0


def period_start(per: str, now: float) -> float:
    """When the current period began (UTC): the 1st of the month, Monday of the week, or 0."""
    if per == "total":
        return 0.0
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = day.replace(day=1) if per == "month" else day - timedelta(days=day.weekday())
    return start.timestamp()


@contextlib.contextmanager
def _transaction(location: str | Path) -> Iterator[tuple[Conn, bool]]:
    backend = open_backend(location)
    conn = backend.connect()
    try:
        conn.execute(backend.begin_sql())
        yield conn, backend.fenced
        conn.execute("COMMIT")
    finally:
        if backend.in_transaction(conn):
            conn.execute("ROLLBACK")
        conn.close()
        backend.close()


def _read(conn: Conn, name: str, *, lock: bool, fenced: bool, now: float) -> TeamBudget | None:
    row = conn.execute("SELECT name, usd, per FROM budgets WHERE name=?" + (" FOR UPDATE" if lock and fenced else ""),
                       (name,)).fetchone()
    if row is None:
        return None
    since = period_start(str(row[2]), now)
    held = conn.execute(
        "SELECT coalesce(sum(CASE WHEN state='live' THEN usd ELSE 0 END), 0),"
        " coalesce(sum(CASE WHEN state<>'live' AND coalesce(released_at, reserved_at) >= ? THEN charged ELSE 0 END), 0)"
        " FROM reservations WHERE budget=?", (since, name)).fetchone()
    return TeamBudget(name=str(row[0]), usd=float(row[1]), per=str(row[2]), reserved_usd=float(held[0]),
                      spent_usd=float(held[1]))


def set_budget(location: str | Path, name: str, usd: float, per: str) -> None:
    with _transaction(location) as (conn, _):
        conn.execute("INSERT INTO budgets (name, usd, per, updated) VALUES (?,?,?,?) ON CONFLICT (name) DO UPDATE"
                     " SET usd=excluded.usd, per=excluded.per, updated=excluded.updated", (name, usd, per, time.time()))


def clear_budget(location: str | Path, name: str) -> bool:
    """Remove the budget `name` (its reservations keep their rows); False if there was none."""
    with _transaction(location) as (conn, _):
        return bool(conn.execute("DELETE FROM budgets WHERE name=?", (name,)).rowcount)


def budgets(location: str | Path) -> list[TeamBudget]:
    """Every team budget with what it holds now."""
    now = time.time()
    with _transaction(location) as (conn, fenced):
        names = [str(r[0]) for r in conn.execute("SELECT name FROM budgets ORDER BY name").fetchall()]
        found = [_read(conn, n, lock=False, fenced=fenced, now=now) for n in names]
    return [b for b in found if b is not None]


def find(location: str | Path, name: str) -> TeamBudget | None:
    """The team budget `name` with what it holds now, or None if the ledger has none of that name."""
    with _transaction(location) as (conn, fenced):
        return _read(conn, name, lock=False, fenced=fenced, now=time.time())


def _read_batch(conn: Conn, row: dict[str, Any], usd: float, *, fenced: bool) -> TeamBudget:
    """The run's own budget (`budget_usd`: all its workers' reservations and charges, but `row`'s
    own attempt's) with `row`'s reservation added, the run's row locked first: the batch's budget
    on a shared ledger, kept exactly as a team budget is."""
    run = str(row["run"])
    if fenced:
        conn.execute("SELECT id FROM runs WHERE id=? FOR UPDATE", (run,))
    held = conn.execute(
        "SELECT coalesce(sum(CASE WHEN state='live' THEN usd ELSE 0 END), 0),"
        " coalesce(sum(CASE WHEN state<>'live' THEN charged ELSE 0 END), 0) FROM reservations"
        " WHERE run=? AND NOT (job=? AND attempt=?)", (run, row["job"], row["attempt"])).fetchone()
    return TeamBudget(name=f"run {run}", usd=usd, per="total", spent_usd=float(held[1]),
                      reserved_usd=float(held[0]) + float(row["usd"]))


def hold(location: str | Path, *, budget: str | None, row: dict[str, Any], batch_usd: float | None = None) -> Held:
    """Reserve `row["usd"]` against the team budget `budget` and (`batch_usd`: a batch on a shared
    ledger, whose jobs many workers run) against its run's own budget, writing the reservation row
    (`row`: the reservations table's columns) if both can hold it, in one transaction that locked
    the budget, then the run, first. On whatever thread calls it (it waits on the database)."""
    now = time.time()
    with _transaction(location) as (conn, fenced):
        found = None
        if budget is not None:
            found = _read(conn, budget, lock=True, fenced=fenced, now=now)
            if found is None or found.spent_usd + found.reserved_usd + float(row["usd"]) > found.usd + 1e-9:
                return Held(ok=False, budget=found)
        batch = None
        if batch_usd is not None:
            batch = _read_batch(conn, row, batch_usd, fenced=fenced)
            if batch.left_usd < -1e-9:
                return Held(ok=False, budget=found, batch=batch)
        cols = [*row, "budget"]
        conn.execute(f"INSERT INTO reservations ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
                     " ON CONFLICT (run, job, attempt) DO UPDATE SET usd=excluded.usd, state='live',"
                     " budget=excluded.budget", (*row.values(), budget))
        return Held(ok=True, budget=found, batch=batch)


__all__ = ["PERIODS", "Held", "TeamBudget", "budgets", "clear_budget", "find", "hold", "period_start", "set_budget"]
