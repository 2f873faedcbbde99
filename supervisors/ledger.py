"""The ledger: the durable record (SQLite, WAL) of owners, jobs, attempts, machines and events.

One writer thread per process owns the write connection and batches what it is handed into
transactions in the order they were queued. A lease queues its intent (`queue_intent`) and its
create call waits until that row is committed; `record_intent` is the same, waited for here.
Readers open connections of their own (`LedgerReader`). A machine row is `alive` from its intent
until the provider confirms it is gone, then `deleted`; a deletion that could not be confirmed
leaves it `alive` with `delete_failed` in its phase, for the next sweep.
"""

from __future__ import annotations

import collections
import os
import re
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
import psutil
from loguru import logger

from actor_run.actors.base import failure_text
from actor_run.actors.flag import Flag
from actor_run.actors.pool import blocking
from actor_run.protocols.failures import ActorRunError
from actor_run.protocols.messages import Event, Machine, Offer, decode_event, encode
from actor_run.protocols.specs import job_key
from actor_run.supervisors.schema import SchemaError, migrate

T = TypeVar("T")

def connect(path: Path) -> sqlite3.Connection:
    """A connection to the ledger at `path` (made if missing), its schema brought up to date (schema.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    try:
        migrate(conn)
    except SchemaError as exc:
        conn.close()
        raise LedgerError(f"{path}: {exc}") from exc
    except sqlite3.Error as exc:
        conn.close()
        raise LedgerError(f"{path}: could not bring the ledger up to date: {exc}") from exc
    return conn


def process_start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class OwnerRow(msgspec.Struct, frozen=True):
    id: str
    pid: int
    started: float
    host: str
    beat: float
    closed: int


def owner_is_alive(row: OwnerRow, *, now: float, stale_after_s: float = 600.0) -> bool:
    """Fail closed: an owner counts as alive unless we can tell it is gone. On this computer, by
    its pid and that process's start time (a reused pid is another process); elsewhere, by a
    heartbeat older than `stale_after_s`."""
    if row.closed:
        return False
    if row.host == socket.gethostname():
        started = process_start_time(row.pid)
        if started is None:
            return False
        return abs(started - row.started) < 2.0
    return now - row.beat < stale_after_s


# a write: (sql, parameters) (consecutive ones of the same sql go to SQLite together: _run_many),
# or a function of the connection for what needs more (a compare-and-set that reads its rowcount)
Op = tuple[str, Any] | Callable[[sqlite3.Connection], Any]


def _run(conn: sqlite3.Connection, op: Op) -> None:
    if isinstance(op, tuple):
        conn.execute(*op)
    else:
        op(conn)


def _run_all(conn: sqlite3.Connection, ops: list[Op]) -> None:
    """Every op, in one transaction, as if in order. Between two function ops, the statements are
    taken table by table (each table's in their order): a statement that writes one table and reads
    no other commutes with those on other tables, and the transaction is seen whole or not at all.
    So a thousand attempts' events, intents and job rows, queued interleaved, go to SQLite as a
    few multi-row statements (_run_many) instead of one per short run: each statement costs a GIL
    hand-off or two, up to 5 ms each on a busy process (600 statements took 200 ms there)."""
    segment: dict[str, list[Op]] = {}
    for op in ops:
        table = _table_of(op)
        if table is None:  # a function, or a statement that may read another table: a barrier
            for group in segment.values():
                _run_runs(conn, group)
            segment = {}
            _run_runs(conn, [op])
        else:
            segment.setdefault(table, []).append(op)
    for group in segment.values():
        _run_runs(conn, group)


_WRITES_ONE_TABLE = re.compile(r"(?:INSERT(?: OR \w+)? INTO|UPDATE) (\w+) ", re.IGNORECASE)
_READS = re.compile(r"\b(SELECT|FROM|JOIN)\b", re.IGNORECASE)  # may read another table
_tables: dict[str, str | None] = {}


def _table_of(op: Op) -> str | None:
    """The one table a statement writes, if it reads no other; None for a function op."""
    if not isinstance(op, tuple):
        return None
    sql = op[0]
    if sql not in _tables:
        m = _WRITES_ONE_TABLE.match(sql)
        _tables[sql] = m.group(1) if m and not _READS.search(sql) else None
    return _tables[sql]


def _run_runs(conn: sqlite3.Connection, ops: list[Op]) -> None:
    """Ops in order; a run of the same statement goes to SQLite as few statements (_run_many)."""
    i, n = 0, len(ops)
    while i < n:
        op = ops[i]
        if not isinstance(op, tuple):
            op(conn)
            i += 1
            continue
        sql, j = op[0], i + 1
        while j < n and isinstance(ops[j], tuple) and ops[j][0] == sql:  # type: ignore[index]
            j += 1
        if j == i + 1:
            conn.execute(sql, op[1])
        else:
            _run_many(conn, sql, [o[1] for o in ops[i:j]])  # type: ignore[index]
        i = j


def _run_many(conn: sqlite3.Connection, sql: str, rows: list[Any]) -> None:
    """`executemany(sql, rows)`, as a few statements of many rows each.

    sqlite3 lets go of the GIL for every row it steps, and on a busy process each time costs up to
    the switch interval (5 ms) to get it back: 200 rows took 1.7 s beside one busy thread, against
    52 ms as multi-row statements (bench/convoy.py). So `INSERT ... VALUES (?,..)` becomes one
    INSERT of many VALUES rows, and `UPDATE t SET .. WHERE ..` one `UPDATE t SET .. FROM (VALUES
    ..) AS v WHERE ..` (each `?` read from v's columns), both with the same effect as one row after
    the other. An UPDATE stays an executemany when that could differ: its WHERE values repeat
    within the run (UPDATE FROM would apply only one of them), or its WHERE is more than equalities
    on columns it does not set (_parse_bulk)."""
    bulk = _bulk_form(sql)
    if bulk is None:
        conn.executemany(sql, rows)
        return
    head, group, tail, where_at = bulk
    if where_at is not None and len({tuple(r[where_at:]) for r in rows}) < len(rows):
        conn.executemany(sql, rows)
        return
    per = max(1, min(_MAX_ROWS, _MAX_VARIABLES // max(group.count("?"), 1)))
    for k in range(0, len(rows), per):
        chunk = rows[k:k + per]
        conn.execute(head + ",".join([group] * len(chunk)) + tail, [x for r in chunk for x in r])


_MAX_ROWS = 500
_MAX_VARIABLES = 999  # SQLite's smallest default limit on `?` in one statement
_QUOTED = re.compile(r"'[^']*'")
_EQUALITIES = re.compile(r"\w+=(\?|'[^']*')( AND \w+=(\?|'[^']*'))*")  # a=? AND b='x' ...
_COMPARED = re.compile(r"(\w+)=\?")  # the columns a WHERE compares with a parameter
_BulkForm = tuple[str, str, str, int | None]
_bulk_forms: dict[str, _BulkForm | None] = {}


def _bulk_form(sql: str) -> _BulkForm | None:
    """`sql` as (head, the VALUES row, tail, where the WHERE's values start in a row or None for
    an INSERT): the statement for k rows is head + k rows joined by commas + tail. None for any
    other shape (or a `?` inside quotes)."""
    if sql not in _bulk_forms:
        _bulk_forms[sql] = _parse_bulk(sql)
    return _bulk_forms[sql]


def _parse_bulk(sql: str) -> _BulkForm | None:
    if '"' in sql or "?" in "".join(_QUOTED.findall(sql)):
        return None
    words = sql.split()
    if words[0].upper() == "INSERT":
        before, sep, rest = sql.partition(" VALUES (")
        group, _, tail = rest.partition(")")
        if not sep or "(" in group or "'" in group or " VALUES (" in rest:
            return None
        return before + " VALUES ", "(" + group + ")", tail, None
    if (words[0].upper() == "UPDATE" and sql.count(" WHERE ") == 1 and " FROM " not in sql.upper()
            and sqlite3.sqlite_version_info >= (3, 33)):  # UPDATE FROM came in SQLite 3.33
        set_part, _, where = sql.partition(" WHERE ")
        # row after row equals one UPDATE FROM only if each row's WHERE picks its rows by equalities
        # on columns no row of the run sets: then distinct WHERE values touch distinct rows
        assigned = {c.split("=")[0].strip() for c in set_part.partition(" SET ")[2].split(",")}
        if not _EQUALITIES.fullmatch(where.strip()) or assigned & set(_COMPARED.findall(where)):
            return None
        names = iter(range(1, sql.count("?") + 1))

        def to_columns(text: str) -> str:  # the k-th `?` of the statement reads v.columnk
            return "".join(f"v.column{next(names)}" if c == "?" else c for c in text)

        head, tail = to_columns(set_part) + " FROM (VALUES ", ") AS v WHERE " + to_columns(where)
        return head, "(" + ",".join("?" * sql.count("?")) + ")", tail, set_part.count("?")
    return None


class LedgerError(ActorRunError):
    """The ledger could not record something (the disk, a lock held too long)."""


class Waiter:
    """One queued write: `done` is set once it is committed (or failed: `error`). `when_done(fn)`
    calls `fn(error)` then, on the writer thread (at once, on the caller's, if it already is): `fn`
    must only hand the news on, never wait on the ledger."""

    __slots__ = ("_callbacks", "_lock", "done", "error")

    def __init__(self) -> None:
        self.done = Flag()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[BaseException | None], None]] = []

    def when_done(self, fn: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(fn)
                return
        fn(self.error)

    def wait(self, timeout: float = 60.0) -> None:
        """Return once the write is durable; raise LedgerError if it failed or took too long."""
        with blocking():
            committed = self.done.wait(timeout)
        if not committed:
            raise LedgerError(f"the ledger did not commit within {timeout:g} s")
        if self.error is not None:
            raise LedgerError(f"the ledger could not record it: {self.error}") from self.error

    def finish(self) -> None:
        with self._lock:
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self.error)
            except Exception:  # one bad callback must not kill the writer thread
                logger.error("a ledger commit callback failed:\n{}", failure_text(*sys.exc_info()))


class _WriteQueue(Generic[T]):
    """The writer thread's queue: a put wakes the writer only when it sleeps (queue.Queue takes a
    Condition and notifies on every put: about twenty Python calls, five writes per attempt)."""

    def __init__(self) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()  # released once per sleep, by the put that ends it
        self._sleeping = False

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            wake, self._sleeping = self._sleeping, False
        if wake:
            self._wake.release()

    def take(self, most: int) -> list[T]:
        """Up to `most` items, oldest first; blocks while there are none."""
        while True:
            with self._lock:
                items = self._items
                if items:
                    n = min(most, len(items))
                    return [items.popleft() for _ in range(n)]
                self._sleeping = True
            self._wake.acquire()


class Ledger:
    """The write side: one thread, one connection, batched transactions."""

    def __init__(self, path: Path, owner: str, run: str = "") -> None:
        self.path = path
        self.owner = owner
        self.run = run  # the run a job goes to unless record_job names another (the Runner's own)
        self._run_of: dict[str, str] = {}  # job key -> its run, for the rows written about that job
        self._conn = connect(path)
        self._queue: _WriteQueue[tuple[Op, Waiter | None] | None] = _WriteQueue()
        self._thread = threading.Thread(target=self._write_loop, name="actor-run-ledger", daemon=True)
        self._closed = False
        self.writes = 0
        self._thread.start()

    # --- the writer thread -----------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            items = self._queue.take(1000)
            batch: list[tuple[Op, Waiter | None]] = []
            for item in items:
                if item is None:  # close(): what came before it is committed, nothing after it is queued
                    if batch:
                        self._commit(batch)
                    return
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[tuple[Op, Waiter | None]]) -> None:
        """One transaction for the batch. If an op fails, the batch is done again with a savepoint
        per op, so only that one is rolled back and its waiter gets the error (savepoints cost
        three statements per op: only when needed). The writer thread never dies of one bad write."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                _run_all(conn, [op for op, _ in batch])
            except sqlite3.Error:  # an op failed: redo the batch so that only that one fails
                conn.execute("ROLLBACK")
                self._commit_one_by_one(batch)
                return
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # BEGIN or COMMIT itself (disk full, locked for 30 s)
            self._failed(batch, exc)
        self._finish(batch)

    def _commit_one_by_one(self, batch: list[tuple[Op, Waiter | None]]) -> None:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op, waiter in batch:
                conn.execute("SAVEPOINT op")
                try:
                    _run(conn, op)
                    conn.execute("RELEASE op")
                except sqlite3.Error as exc:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    logger.error("ledger write failed: {}", exc)
                    if waiter is not None:
                        waiter.error = exc
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._failed(batch, exc)
        finally:
            self._finish(batch)

    def _failed(self, batch: list[tuple[Op, Waiter | None]], exc: sqlite3.Error) -> None:
        logger.error("ledger commit failed: {}", exc)
        for _, waiter in batch:
            if waiter is not None and waiter.error is None:
                waiter.error = exc
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _finish(self, batch: list[tuple[Op, Waiter | None]]) -> None:
        self.writes += len(batch)
        for _, waiter in batch:
            if waiter is not None:
                waiter.finish()

    def _submit(self, op: Op, *, wait: bool = False) -> None:
        """Queue a write; with `wait`, return only once it is committed (or raise LedgerError)."""
        waiter = self._queue_op(op, tracked=wait)
        if waiter is not None:
            waiter.wait()

    def _track(self, op: Op) -> Waiter:
        """Queue a write; its Waiter says when it is durable."""
        waiter = self._queue_op(op, tracked=True)
        assert waiter is not None
        return waiter

    def _queue_op(self, op: Op, *, tracked: bool) -> Waiter | None:
        """Queue a write without waiting; `tracked` returns the Waiter that says when it is durable.
        Writes commit in the order they were queued."""
        if self._closed:
            raise LedgerError("the ledger is closed")
        waiter = Waiter() if tracked else None
        self._queue.put((op, waiter))
        return waiter

    def flush(self) -> None:
        self._submit(lambda c: None, wait=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(30)
        self._conn.close()

    # --- owners ---------------------------------------------------------------------------------

    def register_owner(self) -> None:
        pid = os.getpid()
        started = process_start_time(pid) or time.time()
        host, now, owner = socket.gethostname(), time.time(), self.owner
        self._submit((
            "INSERT OR REPLACE INTO owners (id, pid, started, host, beat, closed) VALUES (?,?,?,?,?,0)",
            (owner, pid, started, host, now)), wait=True)

    def beat_owner(self) -> None:
        now, owner = time.time(), self.owner
        self._submit(("UPDATE owners SET beat=? WHERE id=?", (now, owner)))

    def close_owner(self) -> None:
        owner = self.owner
        self._submit(("UPDATE owners SET closed=1 WHERE id=?", (owner,)), wait=True)

    # --- runs -------------------------------------------------------------------------------------

    def run_of(self, key: str) -> str:
        """The run the job `key` belongs to in this controller (record_job or take_job said so)."""
        return self._run_of.get(key, self.run)

    def start_run(self, run: str, *, batch: str, out_dir: str) -> bool:
        """Record a new run owned by this controller; False if that id is taken (pick another)."""
        made: list[bool] = []
        row = (run, self.owner, batch, out_dir, time.time())

        def op(c: sqlite3.Connection) -> None:
            cur = c.execute("INSERT OR IGNORE INTO runs (id, owner, batch, out_dir, started, state)"
                            " VALUES (?,?,?,?,?,'running')", row)
            made.append(cur.rowcount == 1)

        self._submit(op, wait=True)
        return bool(made and made[-1])

    def take_run(self, run: str) -> None:
        """This controller drives the run now (resume); it is running again until end_run."""
        row = (self.owner, run)
        self._submit(("UPDATE runs SET owner=?, ended=NULL, state='running' WHERE id=?", row), wait=True)

    def end_run(self, run: str) -> None:
        """The controller let go of the run (its jobs ended, or it was closed): durable before it returns."""
        row = (time.time(), run, self.owner)
        self._submit(("UPDATE runs SET ended=?, state='ended' WHERE id=? AND owner=?", row), wait=True)

    # --- machines (the LedgerPort the lease uses) ------------------------------------------------

    def record_intent(self, *, name: str, cloud: str, job: str, seed: int, attempt: int, deadline: float,
                      offer: Offer | None = None) -> None:
        """Durable before it returns."""
        self.queue_intent(name=name, cloud=cloud, job=job, seed=seed, attempt=attempt, deadline=deadline,
                          offer=offer).wait()

    def queue_intent(self, *, name: str, cloud: str, job: str, seed: int, attempt: int, deadline: float,
                     offer: Offer | None = None) -> Waiter:
        """The intent, queued: the Waiter says when it is durable (the create call waits for that)."""
        offer_json = msgspec.json.encode(offer).decode() if offer is not None else None
        run = self.run_of(job_key(job, seed))
        row = (name, cloud, self.owner, run, job, seed, attempt, deadline, "alive", "requested", time.time(),
               offer_json)
        return self._track((
            "INSERT OR REPLACE INTO machines (name, cloud, owner, run, job, seed, attempt, deadline, state, phase,"
            " created, offer) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", row))

    def record_launched(self, machine: Machine) -> None:
        row = (machine.id, machine.region, machine.hourly_usd, msgspec.json.encode(machine).decode(), machine.name)
        self._submit((
            "UPDATE machines SET phase='launched', machine_id=?, region=?, hourly_usd=?, machine=? WHERE name=?", row))

    def claim_job(self, key: str, from_owner: str, run: str | None = None) -> bool:
        """Take a dead owner's unfinished job of `run` (compare-and-set: one resumer wins); the job's
        later rows go to that run."""
        won: list[bool] = []
        owner, now, run = self.owner, time.time(), self.run if run is None else run

        def op(c: sqlite3.Connection) -> None:
            cur = c.execute("UPDATE jobs SET owner=?, updated=? WHERE run=? AND key=? AND owner=? AND state='running'",
                            (owner, now, run, key, from_owner))
            won.append(cur.rowcount == 1)

        self._submit(op, wait=True)
        taken = bool(won and won[-1])  # the last run of the op is the one committed (_commit may redo a batch)
        if taken:
            self._run_of[key] = run
        return taken

    def adopt_machine(self, name: str) -> None:
        """This controller owns the machine now, and a sweep must leave it (resumable) until it is done."""
        row = (self.owner, name)
        self._submit(("UPDATE machines SET owner=?, resumable=1 WHERE name=? AND state='alive'",
                                         row), wait=True)

    def record_started(self, name: str, work: str, pid: int, launched_at: float) -> None:
        row = (work, pid, launched_at, name)
        self._submit((
            "UPDATE machines SET phase='running', work=?, pid=?, launched_at=? WHERE name=?", row))

    def queue_handle(self, name: str, work: str, handle: str, launched_at: float) -> Waiter:
        """A run the provider names by a handle (a queue job), queued: the Waiter says when it is
        durable (the submit does not return before). The row is `running` from then on."""
        row = (work, launched_at, handle, name)
        return self._track((
            "UPDATE machines SET phase='running', work=?, pid=0, launched_at=?, handle=? WHERE name=?", row))

    def record_gone(self, name: str, at: float, reason: str) -> None:
        """Durable before it returns."""
        self.queue_gone(name, at, reason).wait()

    def queue_gone(self, name: str, at: float, reason: str) -> Waiter:
        """The machine is gone, queued: the Waiter says when that is durable."""
        row = (at, reason, name)
        return self._track((
            "UPDATE machines SET state='deleted', phase='deleted', gone=?, reason=?, detail=NULL, resumable=0"
            " WHERE name=?", row))

    def record_delete_failed(self, name: str, detail: str) -> None:
        row = (detail[:500], name)
        self._submit((
            "UPDATE machines SET phase='delete_failed', detail=? WHERE name=? AND state='alive'", row), wait=True)

    def record_cloud(self, name: str, settings: dict[str, Any]) -> None:
        """A cloud this ledger's machines may be on, with its settings (never secrets), for sweeps."""
        row = (name, msgspec.json.encode(settings).decode())
        self._submit(("INSERT OR IGNORE INTO clouds (name, settings) VALUES (?,?)", row), wait=True)

    # --- reservations (supervisors/budget.py) ---------------------------------------------------------

    def record_reserved(self, *, job: str, attempt: int, offer: Offer, hold_s: float, usd: float, seq: int,
                        limit_usd: float | None) -> None:
        """Queued, not waited for: the attempt's intent is queued after it, and commits after it."""
        row = (self.run_of(job), job, attempt, self.owner, offer.cloud, offer.account, offer.region, offer.gpu,
               offer.hourly_usd, hold_s, usd, "live", seq, time.time(), limit_usd)
        self._submit((
            "INSERT OR REPLACE INTO reservations (run, job, attempt, owner, cloud, account, region, gpu, hourly_usd,"
            " hold_s, usd, state, seq, reserved_at, limit_usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row))

    def record_charged(self, *, job: str, attempt: int, usd: float, at_least: bool, seq: int, seconds: float,
                       outcome: str, failure: str | None) -> None:
        """The reservation is replaced by what the attempt cost (its machine's seconds, its outcome)."""
        row = (usd, int(at_least), seq, time.time(), seconds, outcome, failure, self.run_of(job), job, attempt)
        self._submit((
            "UPDATE reservations SET state='released', charged=?, at_least=?, released_seq=?, released_at=?,"
            " seconds=?, outcome=?, failure=? WHERE run=? AND job=? AND attempt=?", row))

    def adopt_reservation(self, job: str, attempt: int) -> None:
        """A resumed attempt's reservation is this controller's now (its release closes it)."""
        row = (self.owner, self.run_of(job), job, attempt)
        self._submit(("UPDATE reservations SET owner=? WHERE run=? AND job=? AND attempt=? AND state='live'", row),
                     wait=True)

    def record_swept_charge(self, *, job: str, attempt: int, usd: float, seconds: float,
                            run: str | None = None) -> None:
        """A dead controller's machine is gone: its live reservation is replaced by what the machine
        cost (reservations.py's reckoning: price x from its creation to its deletion)."""
        row = (usd, seconds, time.time(), job, attempt, run, run)
        self._submit((
            "UPDATE reservations SET state='released', charged=?, seconds=?, outcome='failed', failure='canceled',"
            " released_at=? WHERE job=? AND attempt=? AND state='live' AND (? IS NULL OR run=?)", row))

    # --- jobs, attempts, events ------------------------------------------------------------------

    def record_job(self, *, key: str, name: str, seed: int, spec: bytes, state: str, out_dir: str,
                   run: str | None = None) -> None:
        """The job, in `run` (default: this ledger's run); its later rows go to that run."""
        run = self.run if run is None else run
        self._run_of[key] = run
        row = (run, key, name, seed, self.owner, spec, state, out_dir, time.time())
        self._submit((
            "INSERT INTO jobs (run, key, name, seed, owner, spec, state, out_dir, updated) VALUES (?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT(run, key) DO UPDATE SET owner=excluded.owner, state=excluded.state,"
            " updated=excluded.updated",
            row))  # no wait: the queue is FIFO, so the intent of any machine for it commits after it

    def record_job_end(self, *, key: str, state: str, failure: str | None, detail: str, attempts: int,
                       usd: float) -> Waiter:
        """Queued; the Waiter says when it is durable (the job's handle resolves then)."""
        row = (state, failure, detail[:1000], attempts, usd, time.time(), self.run_of(key), key)
        return self._track((
            "UPDATE jobs SET state=?, failure=?, detail=?, attempts=?, usd=?, updated=? WHERE run=? AND key=?", row))

    def record_attempt(self, *, job: str, attempt: int, machine: str, cloud: str, region: str, state: str,
                       failure: str | None, detail: str, started: float, ended: float | None, usd: float) -> None:
        row = (self.run_of(job), job, attempt, self.owner, machine, cloud, region, state, failure, detail[:1000],
               started, ended, usd)
        self._submit((
            "INSERT OR REPLACE INTO attempts (run, job, attempt, owner, machine, cloud, region, state, failure,"
            " detail, started, ended, usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row))

    def record_event(self, event: Event) -> None:
        key = job_key(event.job, event.seed)
        row = (event.t, self.run_of(key), self.owner, key, event.seed, event.attempt, type(event).__name__,
               encode(event).decode())
        self._submit((
            "INSERT INTO events (t, run, owner, job, seed, attempt, type, body) VALUES (?,?,?,?,?,?,?,?)", row))


class MachineRow(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cloud: str
    owner: str
    job: str
    seed: int
    attempt: int
    deadline: float
    state: str
    phase: str
    machine_id: str | None
    region: str | None
    hourly_usd: float | None
    created: float
    gone: float | None
    reason: str | None
    detail: str | None
    work: str | None
    pid: int | None
    launched_at: float | None
    resumable: int
    machine: str | None = None
    offer: str | None = None
    run: str | None = None
    handle: str | None = None  # a queue job's {endpoint_id, job_id}, JSON


class LedgerReader:
    """A read connection of its own (status, sweep, resume)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = connect(path)

    def close(self) -> None:
        self._conn.close()

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> Iterator[dict[str, Any]]:
        cur = self._conn.execute(sql, args)
        cols = [d[0] for d in cur.description]
        for r in cur.fetchall():
            yield dict(zip(cols, r, strict=True))

    def machines(self, *, alive_only: bool = False) -> list[MachineRow]:
        sql = "SELECT * FROM machines" + (" WHERE state='alive'" if alive_only else "") + " ORDER BY created"
        return [msgspec.convert(r, MachineRow) for r in self._rows(sql)]

    def machine(self, name: str) -> MachineRow | None:
        rows = [msgspec.convert(r, MachineRow) for r in self._rows("SELECT * FROM machines WHERE name=?", (name,))]
        return rows[0] if rows else None

    def owners(self) -> list[OwnerRow]:
        return [msgspec.convert(r, OwnerRow) for r in self._rows("SELECT * FROM owners")]

    def live_owners(self) -> set[str]:
        now = time.time()
        return {o.id for o in self.owners() if owner_is_alive(o, now=now)}

    def clouds(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r["name"], msgspec.json.decode(r["settings"])) for r in self._rows("SELECT * FROM clouds")]

    def jobs(self, run: str | None = None) -> list[dict[str, Any]]:
        """Jobs of every run, or of `run`."""
        cols = "run, key, name, seed, owner, state, failure, detail, attempts, usd, out_dir, spec, updated"
        if run is None:
            return list(self._rows(f"SELECT {cols} FROM jobs ORDER BY run, name, seed"))
        return list(self._rows(f"SELECT {cols} FROM jobs WHERE run=? ORDER BY name, seed", (run,)))

    def reservations(self, run: str | None = None) -> list[dict[str, Any]]:
        """Reservations (budget.py) of every run, or of `run`, in the order they were made."""
        if run is None:
            return list(self._rows("SELECT * FROM reservations ORDER BY reserved_at, run, job, attempt"))
        return list(self._rows("SELECT * FROM reservations WHERE run=? ORDER BY reserved_at, job, attempt", (run,)))

    def attempts(self, run: str | None = None) -> list[dict[str, Any]]:
        if run is None:
            return list(self._rows("SELECT * FROM attempts ORDER BY run, job, attempt"))
        return list(self._rows("SELECT * FROM attempts WHERE run=? ORDER BY job, attempt", (run,)))

    def events(self, job: str | None = None, run: str | None = None) -> list[dict[str, Any]]:
        where, args = [], []
        for column, value in (("job", job), ("run", run)):
            if value is not None:
                where.append(f"{column}=?")
                args.append(value)
        sql = "SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return list(self._rows(sql, tuple(args)))

    def runs(self) -> list[RunRow]:
        """Every run, oldest first, with its jobs counted by state and their cost."""
        sql = (
            "SELECT r.id, r.owner, r.batch, r.out_dir, r.started, r.ended, r.state,"
            " count(j.key) AS jobs, coalesce(sum(j.state='succeeded'), 0) AS succeeded,"
            " coalesce(sum(j.state='failed'), 0) AS failed, coalesce(sum(j.state='running'), 0) AS unfinished,"
            " coalesce(sum(j.usd), 0.0) AS usd"
            " FROM runs r LEFT JOIN jobs j ON j.run = r.id GROUP BY r.id ORDER BY r.started, r.id")
        return [msgspec.convert(r, RunRow) for r in self._rows(sql)]

    def run(self, run: str) -> RunRow | None:
        found = [r for r in self.runs() if r.id == run]
        return found[0] if found else None

    def run_events(self, run: str) -> list[Event]:
        """The events recorded for `run`, in the order they were recorded (the report reads them);
        a kind this version does not know (a newer actor-run wrote it) is passed over."""
        found = []
        for (body,) in self._conn.execute("SELECT body FROM events WHERE run=? ORDER BY id", (run,)).fetchall():
            try:
                found.append(decode_event(body))
            except msgspec.DecodeError:
                continue
        return found


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    """A run as `actor-run runs` lists it: `state` is what its controller last wrote (running |
    ended); whether it is finished or was abandoned is `unfinished` against its owner's liveness."""

    id: str
    owner: str | None
    batch: str | None
    out_dir: str | None
    started: float | None
    ended: float | None
    state: str | None
    jobs: int
    succeeded: int
    failed: int
    unfinished: int
    usd: float
