"""The ledger's tables and how a ledger file written by an older actor-run is brought up to date.

The schema version is kept in the file itself (SQLite's `PRAGMA user_version`; 0 in a file that
predates versions, or a new empty one); in a PostgreSQL ledger, in its table `schema_version`.
The steps are written in SQLite's dialect and run on PostgreSQL through the connection the
backend gives (db.py translates each statement); there a step's transaction
first takes an advisory lock, where SQLite takes its write lock.

`MIGRATIONS` is an ordered list of numbered steps; opening a ledger applies, in order, every step
whose number is above the file's version, each in its own transaction that also sets the version,
so a step is applied whole or not at all, and two processes opening the same old file at once
apply it once (the second finds the version already moved once it holds the write lock). A file
whose version is above the last step was written by a newer actor-run: it is refused, never
rewritten.

To change the schema, append a step: `Migration(version=<last + 1>, name=..., statements=[...])`
for plain SQL, or `apply=` for a function of the connection (a table rebuild, a data fix). Never
edit a step that has shipped: ledgers out there already ran it. Steps run inside a transaction:
no `executescript` (it commits), no `PRAGMA journal_mode`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import msgspec


class Migration(msgspec.Struct, frozen=True, kw_only=True):
    version: int  # the file's version once this step is applied
    name: str
    statements: tuple[str, ...] = ()
    apply: Callable[[sqlite3.Connection], None] | None = None  # run after the statements


class SchemaError(Exception):
    """The ledger file cannot be used by this version of actor-run."""


# version 1: the tables as they were before versions (commit 2e5f0be), created where missing; an
# older file may lack the columns added to `machines` later, and gains them here
_V1_TABLES = (
    """CREATE TABLE IF NOT EXISTS owners (
  id TEXT PRIMARY KEY, pid INTEGER, started REAL, host TEXT, beat REAL, closed INTEGER DEFAULT 0)""",
    """CREATE TABLE IF NOT EXISTS jobs (
  key TEXT PRIMARY KEY, name TEXT, seed INTEGER, owner TEXT, spec BLOB, state TEXT, failure TEXT,
  detail TEXT, attempts INTEGER DEFAULT 0, usd REAL DEFAULT 0, out_dir TEXT, updated REAL)""",
    """CREATE TABLE IF NOT EXISTS attempts (
  job TEXT, attempt INTEGER, owner TEXT, machine TEXT, cloud TEXT, region TEXT, state TEXT, failure TEXT,
  detail TEXT, started REAL, ended REAL, usd REAL, PRIMARY KEY (job, attempt))""",
    """CREATE TABLE IF NOT EXISTS machines (
  name TEXT PRIMARY KEY, cloud TEXT, owner TEXT, job TEXT, seed INTEGER, attempt INTEGER, deadline REAL,
  state TEXT, phase TEXT, machine_id TEXT, region TEXT, hourly_usd REAL, created REAL, gone REAL,
  reason TEXT, detail TEXT, work TEXT, pid INTEGER, launched_at REAL)""",
    "CREATE INDEX IF NOT EXISTS machines_state ON machines (state)",
    "CREATE TABLE IF NOT EXISTS clouds (name TEXT, settings TEXT, PRIMARY KEY (name, settings))",
    """CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, t REAL, owner TEXT, job TEXT, seed INTEGER, attempt INTEGER, type TEXT, body TEXT)""",
)
_V1_ADDED = {"machines": {"resumable": "INTEGER DEFAULT 0", "machine": "TEXT", "offer": "TEXT"}}


def _is_postgres(conn: Any) -> bool:
    return hasattr(conn, "raw")  # db._PgConn: a psycopg connection that takes our SQL


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    if _is_postgres(conn):
        return {row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = ?", (table,)).fetchall()}
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _add_columns(conn: sqlite3.Connection, added: dict[str, dict[str, str]]) -> None:
    for table, columns in added.items():
        have = _columns(conn, table)
        for column, kind in columns.items():
            if column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _v1(conn: sqlite3.Connection) -> None:
    for sql in _V1_TABLES:
        conn.execute(sql)
    _add_columns(conn, _V1_ADDED)


# version 2: runs. Each `actor-run run` (each Runner batch) is a run with a short id; jobs, attempts
# and events are keyed by run, so two runs of one batch never mix, and a run's output folder is kept
# for whoever finishes it. Rows from before runs get one run per owner of their jobs (a job's key was
# unique then, so each job, its attempts, events and machines belong to exactly one such run), id
# the owner's first 8 hex digits, output folder the one its jobs' seed folders sit in.
_V2_NEW = (
    """CREATE TABLE runs (
  id TEXT PRIMARY KEY, owner TEXT, batch TEXT, out_dir TEXT, started REAL, ended REAL,
  state TEXT DEFAULT 'running')""",
    "ALTER TABLE jobs RENAME TO jobs_v1",
    """CREATE TABLE jobs (
  run TEXT NOT NULL, key TEXT NOT NULL, name TEXT, seed INTEGER, owner TEXT, spec BLOB, state TEXT,
  failure TEXT, detail TEXT, attempts INTEGER DEFAULT 0, usd REAL DEFAULT 0, out_dir TEXT, updated REAL,
  PRIMARY KEY (run, key))""",
    "ALTER TABLE attempts RENAME TO attempts_v1",
    """CREATE TABLE attempts (
  run TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL, owner TEXT, machine TEXT, cloud TEXT,
  region TEXT, state TEXT, failure TEXT, detail TEXT, started REAL, ended REAL, usd REAL,
  PRIMARY KEY (run, job, attempt))""",
    "ALTER TABLE events ADD COLUMN run TEXT",
    "ALTER TABLE machines ADD COLUMN run TEXT",
)
_LEGACY_RUN = "coalesce(nullif(substr(owner, 1, 8), ''), 'legacy')"


def _v2(conn: sqlite3.Connection) -> None:
    for sql in _V2_NEW:
        conn.execute(sql)
        if sql.endswith("RENAME TO jobs_v1") and _is_postgres(conn):  # an index's name is its own there
            conn.execute("ALTER INDEX IF EXISTS jobs_pkey RENAME TO jobs_v1_pkey")
        if sql.endswith("RENAME TO attempts_v1") and _is_postgres(conn):
            conn.execute("ALTER INDEX IF EXISTS attempts_pkey RENAME TO attempts_v1_pkey")
    runs: dict[str, tuple[str, str, float, float, bool]] = {}  # id -> owner, out_dir, started, ended, unfinished
    rows = conn.execute(f"SELECT {_LEGACY_RUN}, owner, out_dir, updated, state FROM jobs_v1").fetchall()
    for run, owner, out_dir, updated, state in rows:
        was = runs.get(run)
        root = str(PurePath(out_dir).parent.parent) if out_dir else ""
        t = float(updated or 0.0)
        if was is None:
            runs[run] = (owner or "", root, t, t, state == "running")
        else:
            runs[run] = (was[0], was[1] or root, min(was[2], t), max(was[3], t), was[4] or state == "running")
    conn.executemany(
        "INSERT INTO runs (id, owner, batch, out_dir, started, ended, state) VALUES (?,?,'',?,?,?,?)",
        [(run, owner, root, started, None if unfinished else ended, "running" if unfinished else "ended")
         for run, (owner, root, started, ended, unfinished) in runs.items()])
    conn.execute(
        "INSERT INTO jobs (run, key, name, seed, owner, spec, state, failure, detail, attempts, usd, out_dir,"
        f" updated) SELECT {_LEGACY_RUN}, key, name, seed, owner, spec, state, failure, detail, attempts, usd,"
        " out_dir, updated FROM jobs_v1")
    run_of_job = "(SELECT j.run FROM jobs j WHERE j.key = {0})"
    conn.execute(
        "INSERT INTO attempts (run, job, attempt, owner, machine, cloud, region, state, failure, detail, started,"
        f" ended, usd) SELECT coalesce({run_of_job.format('attempts_v1.job')}, {_LEGACY_RUN}), job, attempt,"
        " owner, machine, cloud, region, state, failure, detail, started, ended, usd FROM attempts_v1")
    conn.execute(f"UPDATE events SET run = coalesce({run_of_job.format('events.job')}, {_LEGACY_RUN})")
    conn.execute("UPDATE machines SET run = (SELECT j.run FROM jobs j WHERE j.name = machines.job"
                 " AND j.seed = machines.seed)")
    conn.execute("DROP TABLE jobs_v1")
    conn.execute("DROP TABLE attempts_v1")
    conn.execute("CREATE INDEX events_run_job ON events (run, job)")
    conn.execute("CREATE INDEX jobs_owner ON jobs (owner, state)")


# version 3: reservations (budget.py). Before an attempt leases a machine its job reserves the
# offer's price x the longest it may hold the machine; when the machine is gone the reservation is
# replaced by the charge. `seq` / `released_seq` order the changes of one controller's budget; a
# resume reads the live ones back, and a sweep or a resume charges those of dead controllers.
_V3_NEW = (
    """CREATE TABLE reservations (
  run TEXT NOT NULL, job TEXT NOT NULL, attempt INTEGER NOT NULL, owner TEXT, cloud TEXT, account TEXT,
  region TEXT, gpu TEXT, hourly_usd REAL, hold_s REAL, usd REAL, state TEXT, charged REAL,
  at_least INTEGER DEFAULT 0, seq INTEGER, released_seq INTEGER, reserved_at REAL, released_at REAL,
  limit_usd REAL, seconds REAL, outcome TEXT, failure TEXT, PRIMARY KEY (run, job, attempt))""",
    "CREATE INDEX reservations_state ON reservations (state)",
)

# version 4: owners across machines. An owner's lease (seconds since the epoch, by the database's
# clock) that it renews and that nobody renews once it has run out; a job claim's fencing token;
# the queue of jobs waiting for a worker, oldest first.
_V4 = (
    "ALTER TABLE owners ADD COLUMN lease_until REAL",
    "ALTER TABLE jobs ADD COLUMN token TEXT",
    "CREATE INDEX jobs_queue ON jobs (state, updated)",
)


MIGRATIONS: list[Migration] = [
    Migration(version=1, name="the tables before versions", apply=_v1),
    Migration(version=2, name="runs: jobs, attempts and events keyed by run", apply=_v2),
    Migration(version=3, name="reservations: money set aside before each lease, then charged", statements=_V3_NEW),
    Migration(version=4, name="owner leases, claim tokens, the job queue", statements=_V4),
    # a run the provider names by a handle (a RunPod serverless queue job: {endpoint_id, job_id}),
    # recorded before its submit returns, so resume follows the job instead of submitting it again
    Migration(version=5, name="machines.handle: a queue job's handle",
              statements=("ALTER TABLE machines ADD COLUMN handle TEXT",)),
    # `actor-run cancel` from another process: one row per job asked to stop; each controller reads
    # the rows after the last it saw (cancels.py) and cancels the jobs it runs
    Migration(version=6, name="cancels: jobs asked to stop from another process",
              statements=("CREATE TABLE cancels (id INTEGER PRIMARY KEY, t REAL, run TEXT, job TEXT, detail TEXT)",)),
    # team budgets across runs (team.py): a named limit per month, week or in all; each reservation
    # of a batch that draws on one names it, and is made in the transaction that checks the limit
    Migration(version=7, name="budgets: team budgets across runs; reservations.budget",
              statements=("CREATE TABLE budgets (name TEXT PRIMARY KEY, usd REAL NOT NULL, per TEXT NOT NULL,"
                          " updated REAL)", "ALTER TABLE reservations ADD COLUMN budget TEXT")),
    # cache volumes (a candidate's `cache`): recorded before the provider makes one, never deleted by
    # a run, listed and deleted by `actor-run sweep --caches`, their storage in `actor-run cost`
    Migration(version=8, name="caches: volumes that outlive an attempt",
              statements=("""CREATE TABLE caches (
  cloud TEXT NOT NULL, region TEXT NOT NULL, name TEXT NOT NULL, volume_id TEXT, size_gb INTEGER, state TEXT,
  created REAL, deleted REAL, usd_per_gb_month REAL, owner TEXT, PRIMARY KEY (cloud, region, name))""",)),
]


def current_version() -> int:
    return MIGRATIONS[-1].version


def version_of(conn: sqlite3.Connection) -> int:
    if _is_postgres(conn):
        # the table is made when the backend connects (db.py): a plain read here sees what a
        # migrator that held the lock before committed (a catalog lookup could still miss its table)
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row[0] is not None else 0
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def _begin(conn: sqlite3.Connection) -> None:
    """A step's transaction, holding the lock that keeps a second migrator out until it ends."""
    if _is_postgres(conn):
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(7346115)")
    else:
        conn.execute("BEGIN IMMEDIATE")


def _set_version(conn: sqlite3.Connection, version: int) -> None:
    if _is_postgres(conn):
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    else:
        conn.execute(f"PRAGMA user_version = {int(version)}")


def migrate(conn: sqlite3.Connection, steps: list[Migration] | None = None) -> int:
    """Bring the ledger behind `conn` (autocommit mode, no transaction open) up to the last step;
    returns the version it had. Raises SchemaError for a file newer than this code."""
    steps = MIGRATIONS if steps is None else steps
    numbers = [m.version for m in steps]
    if numbers != list(range(1, len(steps) + 1)):
        raise SchemaError(f"migration steps must be numbered 1, 2, 3, ... in order, got {numbers}")
    last = numbers[-1]
    found = version_of(conn)
    if found > last:
        raise SchemaError(f"the ledger is at schema version {found}, written by a newer actor-run (this one knows up "
                          f"to {last}); upgrade actor-run or use another --ledger")
    if found == last:
        return found
    for step in steps:
        _begin(conn)  # the write lock: a second opener waits here, then sees the new version
        try:
            if version_of(conn) >= step.version:
                conn.execute("ROLLBACK")
                continue
            for sql in step.statements:
                conn.execute(sql)
            if step.apply is not None:
                step.apply(conn)
            _set_version(conn, step.version)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return found
