"""The ledger: the durable record of owners, runs, jobs, attempts, machines and events, in an
SQLite file (WAL; the default) or a PostgreSQL database shared by many controllers (ledger_db.py
says how each is spoken to; schema.py how its tables come to be and are upgraded).

One writer thread per process owns the write connection and batches what it is handed into
transactions in the order they were queued (ledger_batch.py runs a batch). A lease queues its
intent (`queue_intent`) and its create call waits until that row is committed; `record_intent` is
the same, waited for here. Readers open connections of their own (`LedgerReader`). A machine row
is `alive` from its intent until the provider confirms it is gone, then `deleted`; a deletion
that could not be confirmed leaves it `alive` with `delete_failed` in its phase, for the next
sweep.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec
import psutil
from loguru import logger

from actor_run.actors.base import failure_text
from actor_run.actors.flag import Flag
from actor_run.actors.pool import blocking
from actor_run.protocols.messages import Event, Machine, Offer, decode_event, encode
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger_batch import Op, _run, _run_all
from actor_run.supervisors.ledger_db import Conn, LedgerError, open_backend

T = TypeVar("T")

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
    lease_until: float | None = None


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


class Claimed(msgspec.Struct, frozen=True, kw_only=True):
    """A queued job this controller claimed: its run, key, spec (secrets redacted), fencing token
    and the seed folder its run said its results go to."""

    run: str
    key: str
    spec: bytes
    token: str
    out_dir: str | None


class StaleClaim(LedgerError):
    """This controller no longer holds the job (its lease expired, another controller claimed it):
    the write was not made, and the job is no longer this controller's to touch."""


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
        if isinstance(self.error, StaleClaim):
            raise StaleClaim(str(self.error))
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


# what the writer thread queues: a write, who waits for it, and the job whose claim fences it
_Item = tuple[Op, "Waiter | None", "str | None"]


_RECORD_JOB = ("INSERT INTO jobs (run, key, name, seed, owner, spec, state, out_dir, updated, token)"
               " VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(run, key) DO UPDATE SET owner=excluded.owner,"
               " state=excluded.state, updated=excluded.updated, token=excluded.token")


class Ledger:
    """The write side: one thread, one connection, batched transactions.

    On a fenced backend (PostgreSQL) each transaction first reads, under a share lock, this owner's
    lease and the fencing token of every job its writes are about: writes of a job whose token is
    no longer the one this controller claimed it with, or of any job once this owner's lease has
    expired, are not made; their waiters get StaleClaim and `on_stale(keys)` is told once per job
    (on the writer thread: it must only hand the news on)."""

    def __init__(self, path: str | Path, owner: str, run: str = "", *, lease_s: float = 60.0) -> None:
        self.backend = open_backend(path)
        self.path = self.backend.location
        self.owner = owner
        self.run = run  # the run a job goes to unless record_job names another (the Runner's own)
        self._run_of: dict[str, str] = {}  # job key -> its run, for the rows written about that job
        self.lease_s = lease_s
        self.tokens: dict[str, str] = {}  # job key -> the fencing token this controller claimed it with
        self.stale: set[str] = set()  # job keys this controller lost
        self.lease_lost = False
        self.on_stale: Callable[[set[str]], None] | None = None
        self._machine_jobs: dict[str, str] = {}  # machine name -> job key (fences the machine's writes)
        self._conn = self.backend.connect()
        self._queue: _WriteQueue[_Item | None] = _WriteQueue()
        self._thread = threading.Thread(target=self._write_loop, name="actor-run-ledger", daemon=True)
        self._closed = False
        self.writes = 0
        self.commits = 0
        self._thread.start()

    # --- the writer thread -----------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            items = self._queue.take(1000)
            batch: list[_Item] = []
            for item in items:
                if item is None:  # close(): what came before it is committed, nothing after it is queued
                    if batch:
                        self._commit(batch)
                    return
                batch.append(item)
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        """One transaction for the batch. If an op fails, the batch is done again with a savepoint
        per op, so only that one is rolled back and its waiter gets the error (savepoints cost
        three statements per op: only when needed). The writer thread never dies of one bad write."""
        if self.backend.fenced and getattr(self._conn, "closed", False):
            self._reconnect()
        conn, errors = self._conn, self.backend.errors
        refused: list[_Item] = []
        try:
            conn.execute(self.backend.begin_sql())
            if self.backend.fenced:
                batch, refused = self._fence(batch)
            try:
                _run_all(conn, [op for op, _, _ in batch])
            except errors:  # an op failed: redo the batch so that only that one fails
                conn.execute("ROLLBACK")
                self._commit_one_by_one(batch + refused)
                return
            conn.execute("COMMIT")
            self.commits += 1
        except errors as exc:  # BEGIN or COMMIT itself (disk full, locked for 30 s, the server gone)
            self._failed(batch, exc)
        self._finish(batch + refused)

    def _fence(self, batch: list[_Item]) -> tuple[list[_Item], list[_Item]]:
        """Split the batch into the writes this controller may still make and those it may not
        (inside the transaction, whose share locks keep a claim from moving until it commits).
        Once this owner's lease has expired it may make none: it is dead for everyone."""
        lost: set[str] = set()
        if not self.lease_lost:
            row = self._conn.execute(
                f"SELECT lease_until > {self.backend.now_sql} FROM owners WHERE id=? FOR SHARE",
                (self.owner,)).fetchone()
            if row is not None and row[0] is False:
                self.lease_lost = True
                lost = set(self.tokens) - self.stale
                logger.error("this controller's lease in the ledger expired: it writes nothing more and lets "
                             "its jobs go to the controllers that adopt them")
        if not self.lease_lost:
            claimed_here = {op[1][1] for op, _, _ in batch if isinstance(op, tuple) and op[0] is _RECORD_JOB}
            held = {fence: self.tokens[fence] for _, _, fence in batch
                    if fence is not None and fence in self.tokens and fence not in self.stale
                    and fence not in claimed_here}
            if held:
                rows = self._conn.execute("SELECT run, key, token FROM jobs WHERE key = ANY(?) FOR SHARE",
                                          (list(held),)).fetchall()
                now = {key: token for run, key, token in rows if run == self.run_of(key)}
                lost = {k for k, token in held.items() if now.get(k) != token}
        if lost:
            self.stale |= lost
            if self.on_stale is not None:
                try:
                    self.on_stale(lost)
                except Exception:  # the writer thread must live on
                    logger.error("a ledger stale-claim callback failed:\n{}", failure_text(*sys.exc_info()))
        if not self.stale and not self.lease_lost:
            return batch, []
        kept, refused = [], []
        for item in batch:
            if self.lease_lost or (item[2] is not None and item[2] in self.stale):
                refused.append(item)
                if item[1] is not None:
                    item[1].error = StaleClaim(f"{item[2] or 'this write'} is no longer this controller's to make"
                                               + (" (its lease expired)" if self.lease_lost else ""))
            else:
                kept.append(item)
        return kept, refused

    def _reconnect(self) -> None:
        """The server ended the session (a restart, a cut, a transaction left idle too long while
        this process was frozen): a new connection; the fencing check on it decides what may go on."""
        try:
            self._conn = self.backend.connect()
        except self.backend.errors as exc:
            logger.error("could not reconnect to the ledger {}: {}", self.backend.describe(), exc)

    def _commit_one_by_one(self, batch: list[_Item]) -> None:
        conn, errors = self._conn, self.backend.errors
        try:
            conn.execute(self.backend.begin_sql())
            if self.backend.fenced:
                batch, refused = self._fence(batch)
                self._finish(refused)
            for op, waiter, _ in batch:
                conn.execute("SAVEPOINT op")
                try:
                    _run(conn, op)
                    conn.execute("RELEASE op")
                except errors as exc:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    logger.error("ledger write failed: {}", exc)
                    if waiter is not None:
                        waiter.error = exc
            conn.execute("COMMIT")
            self.commits += 1
        except errors as exc:
            self._failed(batch, exc)
        finally:
            self._finish(batch)

    def _failed(self, batch: list[_Item], exc: Exception) -> None:
        logger.error("ledger commit failed: {}", exc)
        for _, waiter, _ in batch:
            if waiter is not None and waiter.error is None:
                waiter.error = exc
        if self.backend.in_transaction(self._conn):
            with contextlib.suppress(*self.backend.errors):
                self._conn.execute("ROLLBACK")

    def _finish(self, batch: list[_Item]) -> None:
        self.writes += len(batch)
        for _, waiter, _ in batch:
            if waiter is not None:
                waiter.finish()

    def _submit(self, op: Op, *, wait: bool = False, fence: str | None = None) -> None:
        """Queue a write; with `wait`, return only once it is committed (or raise LedgerError)."""
        waiter = self._queue_op(op, tracked=wait, fence=fence)
        if waiter is not None:
            waiter.wait()

    def _track(self, op: Op, fence: str | None = None) -> Waiter:
        """Queue a write; its Waiter says when it is durable."""
        waiter = self._queue_op(op, tracked=True, fence=fence)
        assert waiter is not None
        return waiter

    def _queue_op(self, op: Op, *, tracked: bool, fence: str | None = None) -> Waiter | None:
        """Queue a write without waiting; `tracked` returns the Waiter that says when it is durable.
        Writes commit in the order they were queued. `fence`: the job key whose claim this write
        needs (on a fenced backend it is not made once the claim is lost)."""
        if self._closed:
            raise LedgerError("the ledger is closed")
        waiter = Waiter() if tracked else None
        self._queue.put((op, waiter, fence if fence in self.tokens else None))
        return waiter

    def _machine_fence(self, name: str) -> str | None:
        return self._machine_jobs.get(name)

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
        """This controller is alive; on a fenced backend, with a lease of `lease_s` from now (by the
        database's clock) that `beat_owner` renews."""
        pid = os.getpid()
        started = process_start_time(pid) or time.time()
        host, now, owner = socket.gethostname(), time.time(), self.owner
        lease = self.lease_s
        self._submit((
            f"INSERT OR REPLACE INTO owners (id, pid, started, host, beat, closed, lease_until)"
            f" VALUES (?,?,?,?,?,0,{self.backend.now_sql} + ?)",
            (owner, pid, started, host, now, lease)), wait=True)

    def beat_owner(self) -> bool:
        """Renew the lease (queued; the Waiter-free write commits with the next batch). Returns False
        once this owner's lease is known to have expired: it is dead for everyone then."""
        now, owner, lease = time.time(), self.owner, self.lease_s
        if self.lease_lost:
            return False
        # an expired lease is never renewed: another controller may have taken its jobs already
        self._submit((f"UPDATE owners SET beat=?, lease_until={self.backend.now_sql} + ?"
                      f" WHERE id=? AND closed=0 AND (lease_until IS NULL OR lease_until > {self.backend.now_sql})",
                      (now, lease, owner)))
        return True

    def close_owner(self) -> None:
        if self.lease_lost:
            return  # dead for everyone already, and it writes nothing more
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

        def op(c: Conn) -> None:
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
        """The controller let go of the run (its jobs ended, or it was closed): durable before it
        returns. Not once this owner's lease has expired: it writes nothing more."""
        if self.lease_lost:
            return
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
        key = job_key(job, seed)
        run = self.run_of(key)
        row = (name, cloud, self.owner, run, job, seed, attempt, deadline, "alive", "requested", time.time(),
               offer_json)
        if key in self.tokens:
            self._machine_jobs[name] = key
        return self._track((
            "INSERT OR REPLACE INTO machines (name, cloud, owner, run, job, seed, attempt, deadline, state, phase,"
            " created, offer) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", row), key)

    def record_launched(self, machine: Machine) -> None:
        row = (machine.id, machine.region, machine.hourly_usd, msgspec.json.encode(machine).decode(), machine.name)
        self._submit((
            "UPDATE machines SET phase='launched', machine_id=?, region=?, hourly_usd=?, machine=? WHERE name=?", row),
            fence=self._machine_fence(machine.name))

    def claim_job(self, key: str, from_owner: str, run: str | None = None) -> bool:
        """Take a dead owner's unfinished job of `run` (compare-and-set: one resumer wins), with a
        fresh fencing token; the job's later rows go to that run."""
        won: list[bool] = []
        owner, now, run, token = self.owner, time.time(), self.run if run is None else run, uuid.uuid4().hex

        def op(c: Conn) -> None:
            cur = c.execute("UPDATE jobs SET owner=?, updated=?, token=? WHERE run=? AND key=? AND owner=?"
                            " AND state='running'", (owner, now, token, run, key, from_owner))
            won.append(cur.rowcount == 1)

        try:
            self._submit(op, wait=True)
        except StaleClaim:
            return False
        if won and won[-1]:  # the last run of the op is the one committed (_commit may redo a batch)
            self._run_of[key] = run
            self.tokens[key] = token
            self.stale.discard(key)
            return True
        return False

    def claim_queued(self, most: int) -> list[Claimed]:
        """Claim up to `most` queued jobs of any run, oldest first, each with a fresh fencing token.
        On PostgreSQL, controllers claiming at once skip each other's rows (FOR UPDATE SKIP LOCKED);
        SQLite has one writer at a time."""
        if most < 1:
            return []
        got: list[list[Claimed]] = []
        owner, now, prefix = self.owner, time.time(), uuid.uuid4().hex
        lock = " FOR UPDATE SKIP LOCKED" if self.backend.fenced else ""

        def op(c: Conn) -> None:
            rows = c.execute(
                "UPDATE jobs SET owner=?, state='running', updated=?, token=? || run || '/' || key"
                " WHERE (run, key) IN ("
                f"SELECT run, key FROM jobs WHERE state='queued' ORDER BY updated, run, key LIMIT ?{lock})"
                " RETURNING run, key, spec, token, out_dir", (owner, now, prefix, most)).fetchall()
            got.append([Claimed(run=r[0], key=r[1], spec=bytes(r[2]), token=r[3], out_dir=r[4]) for r in rows])

        try:
            self._submit(op, wait=True)
        except StaleClaim:
            return []  # this controller's lease expired meanwhile: it claims nothing
        claimed = got[-1] if got else []  # the last run of the op is the one committed
        for c in claimed:
            self._run_of[c.key] = c.run
            self.tokens[c.key] = c.token
            self.stale.discard(c.key)
        return claimed

    def adopt_machine(self, name: str, key: str | None = None) -> None:
        """This controller owns the machine now, and a sweep must leave it (resumable) until it is done."""
        if key is not None and key in self.tokens:
            self._machine_jobs[name] = key
        row = (self.owner, name)
        self._submit(("UPDATE machines SET owner=?, resumable=1 WHERE name=? AND state='alive'",
                      row), wait=True, fence=self._machine_fence(name))

    def record_started(self, name: str, work: str, pid: int, launched_at: float) -> None:
        row = (work, pid, launched_at, name)
        self._submit((
            "UPDATE machines SET phase='running', work=?, pid=?, launched_at=? WHERE name=?", row),
            fence=self._machine_fence(name))

    def record_taken(self, name: str, at: float) -> None:
        """The provider took the machine away (a preemption) at `at`: its bill stopped then. Kept in
        the machine's record (its `taken_at`), queued before the deletion is (the queue is FIFO), so
        a controller that dies between the deletion and the charge leaves what the settle of its
        reservation needs (reservations.py)."""

        def op(c: Conn) -> None:
            row = c.execute("SELECT machine FROM machines WHERE name=?", (name,)).fetchone()
            if row is None or row[0] is None:
                return  # never made: nothing billed
            m = msgspec.json.decode(row[0], type=Machine)
            c.execute("UPDATE machines SET machine=? WHERE name=?",
                      (msgspec.json.encode(msgspec.structs.replace(m, taken_at=at)).decode(), name))

        self._submit(op, fence=self._machine_fence(name))

    def queue_handle(self, name: str, work: str, handle: str, launched_at: float) -> Waiter:
        """A run the provider names by a handle (a queue job), queued: the Waiter says when it is
        durable (the submit does not return before). The row is `running` from then on."""
        row = (work, launched_at, handle, name)
        return self._track((
            "UPDATE machines SET phase='running', work=?, pid=0, launched_at=?, handle=? WHERE name=?", row),
            self._machine_fence(name))

    def record_gone(self, name: str, at: float, reason: str) -> None:
        """Durable before it returns."""
        self.queue_gone(name, at, reason).wait()

    def queue_gone(self, name: str, at: float, reason: str) -> Waiter:
        """The machine is gone, queued: the Waiter says when that is durable."""
        row = (at, reason, name)
        return self._track((
            "UPDATE machines SET state='deleted', phase='deleted', gone=?, reason=?, detail=NULL, resumable=0"
            " WHERE name=?", row), self._machine_fence(name))

    def record_delete_failed(self, name: str, detail: str) -> None:
        row = (detail[:500], name)
        self._submit((
            "UPDATE machines SET phase='delete_failed', detail=? WHERE name=? AND state='alive'", row), wait=True,
            fence=self._machine_fence(name))

    def still_holds(self, name: str) -> bool:
        """False once the job of the machine `name` is known to be another controller's (or this
        owner's lease expired): its machine is then the adopter's to keep or delete, not this
        controller's. What this process knows now; `check_hold` asks the database."""
        key = self._machine_jobs.get(name)
        return key is None or (key not in self.stale and not self.lease_lost)

    def check_hold(self, name: str) -> Waiter | None:
        """On a fenced backend, a no-op write fenced by the machine's job: once it is done (made, or
        refused as stale), `still_holds` says what the database said. None when there is nothing
        to ask: an SQLite ledger, a machine of no claimed job, a job already known lost."""
        key = self._machine_jobs.get(name)
        if not self.backend.fenced or key is None or key in self.stale or self.lease_lost or self._closed:
            return None
        return self._track(lambda c: None, key)

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
            " hold_s, usd, state, seq, reserved_at, limit_usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row),
            fence=job)

    def record_charged(self, *, job: str, attempt: int, usd: float, at_least: bool, seq: int, seconds: float,
                       outcome: str, failure: str | None) -> None:
        """The reservation is replaced by what the attempt cost (its machine's seconds, its outcome)."""
        row = (usd, int(at_least), seq, time.time(), seconds, outcome, failure, self.run_of(job), job, attempt)
        self._submit((
            "UPDATE reservations SET state='released', charged=?, at_least=?, released_seq=?, released_at=?,"
            " seconds=?, outcome=?, failure=? WHERE run=? AND job=? AND attempt=?", row), fence=job)

    def adopt_reservation(self, job: str, attempt: int) -> None:
        """A resumed attempt's reservation is this controller's now (its release closes it)."""
        row = (self.owner, self.run_of(job), job, attempt)
        self._submit(("UPDATE reservations SET owner=? WHERE run=? AND job=? AND attempt=? AND state='live'", row),
                     wait=True, fence=job)

    def record_swept_charge(self, *, job: str, attempt: int, usd: float, seconds: float,
                            run: str | None = None) -> None:
        """A dead controller's machine is gone: its live reservation is replaced by what the machine
        cost (reservations.py's reckoning: price x from its creation to its deletion)."""
        row = (usd, seconds, time.time(), job, attempt, run, run)
        self._submit((
            "UPDATE reservations SET state='released', charged=?, seconds=?, outcome='failed', failure='canceled',"
            " released_at=? WHERE job=? AND attempt=? AND state='live' AND (CAST(? AS TEXT) IS NULL OR run=?)", row))

    # --- jobs, attempts, events ------------------------------------------------------------------

    def record_job(self, *, key: str, name: str, seed: int, spec: bytes, state: str, out_dir: str,
                   run: str | None = None) -> None:
        """The job, in `run` (default: this ledger's run), this controller's from now on with a
        fresh fencing token; its later rows go to that run."""
        run = self.run if run is None else run
        self._run_of[key] = run
        token = uuid.uuid4().hex
        self.tokens[key] = token
        self.stale.discard(key)
        row = (run, key, name, seed, self.owner, spec, state, out_dir, time.time(), token)
        # no wait: the queue is FIFO, so the intent of any machine for it commits after it
        self._submit((_RECORD_JOB, row))

    def record_job_end(self, *, key: str, state: str, failure: str | None, detail: str, attempts: int,
                       usd: float) -> Waiter:
        """Queued; the Waiter says when it is durable (the job's handle resolves then)."""
        row = (state, failure, detail[:1000], attempts, usd, time.time(), self.run_of(key), key)
        return self._track((
            "UPDATE jobs SET state=?, failure=?, detail=?, attempts=?, usd=?, updated=? WHERE run=? AND key=?", row),
            key)

    def record_attempt(self, *, job: str, attempt: int, machine: str, cloud: str, region: str, state: str,
                       failure: str | None, detail: str, started: float, ended: float | None, usd: float) -> None:
        row = (self.run_of(job), job, attempt, self.owner, machine, cloud, region, state, failure, detail[:1000],
               started, ended, usd)
        self._submit((
            "INSERT OR REPLACE INTO attempts (run, job, attempt, owner, machine, cloud, region, state, failure,"
            " detail, started, ended, usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row), fence=job)

    def record_event(self, event: Event) -> None:
        key = job_key(event.job, event.seed)
        row = (event.t, self.run_of(key), self.owner, key, event.seed, event.attempt, type(event).__name__,
               encode(event).decode())
        self._submit((
            "INSERT INTO events (t, run, owner, job, seed, attempt, type, body) VALUES (?,?,?,?,?,?,?,?)", row),
            fence=key)


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
    """A read side of its own (status, sweep, resume): a connection of its own on SQLite, one
    borrowed from the process's pool per query on PostgreSQL."""

    def __init__(self, path: str | Path) -> None:
        self.backend = open_backend(path)
        self.path = self.backend.location
        if not self.backend.fenced:
            with self.backend.reading():  # the file and its schema, as before
                pass

    def close(self) -> None:
        self.backend.close()

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> Iterator[dict[str, Any]]:
        with self.backend.reading() as conn:
            cur = conn.execute(sql, args)
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
        for r in rows:
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
        """Owners alive now: on PostgreSQL those whose lease has not expired by the database's clock
        (the same answer on every host); on SQLite by pid and start time (owner_is_alive)."""
        if self.backend.fenced:
            rows = self._rows(f"SELECT id, lease_until IS NULL OR lease_until > {self.backend.now_sql} AS live"
                              " FROM owners WHERE closed=0")
            return {r["id"] for r in rows if r["live"]}
        now = time.time()
        return {o.id for o in self.owners() if owner_is_alive(o, now=now)}

    def clouds(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r["name"], msgspec.json.decode(r["settings"])) for r in self._rows("SELECT * FROM clouds")]

    def has_orphans(self, *, me: str) -> bool:
        """Whether some running job's owner is dead (a resume would take it): one small query on a
        shared ledger, where a worker asks it every poll before it plans an adoption."""
        if self.backend.fenced:
            rows = self._rows(
                "SELECT 1 AS x FROM jobs j WHERE j.state='running' AND j.owner <> ? AND NOT EXISTS (SELECT 1 FROM"
                f" owners o WHERE o.id = j.owner AND o.closed = 0 AND (o.lease_until IS NULL OR o.lease_until >"
                f" {self.backend.now_sql})) LIMIT 1", (me,))
            return any(True for _ in rows)
        live = self.live_owners() | {me}
        return any(r["owner"] not in live for r in self._rows("SELECT DISTINCT owner FROM jobs WHERE state='running'"))

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
        """Every run, oldest first, with its jobs counted by state and their cost; on a shared
        ledger also its running jobs held by a live owner (`held`: workers run it, whoever
        started it)."""
        held = "0" if not self.backend.fenced else (
            "coalesce(sum(CASE WHEN j.state='running' AND EXISTS (SELECT 1 FROM owners o WHERE o.id = j.owner"
            f" AND o.closed = 0 AND o.lease_until > {self.backend.now_sql}) THEN 1 ELSE 0 END), 0)")
        sql = (
            "SELECT r.id, r.owner, r.batch, r.out_dir, r.started, r.ended, r.state,"
            " count(j.key) AS jobs, coalesce(sum(CASE WHEN j.state='succeeded' THEN 1 ELSE 0 END), 0) AS succeeded,"
            " coalesce(sum(CASE WHEN j.state='failed' THEN 1 ELSE 0 END), 0) AS failed,"
            " coalesce(sum(CASE WHEN j.state IN ('running', 'queued') THEN 1 ELSE 0 END), 0) AS unfinished,"
            " coalesce(sum(CASE WHEN j.state='queued' THEN 1 ELSE 0 END), 0) AS queued,"
            f" {held} AS held, coalesce(sum(j.usd), 0.0) AS usd"
            " FROM runs r LEFT JOIN jobs j ON j.run = r.id GROUP BY r.id ORDER BY r.started, r.id")
        return [msgspec.convert(r, RunRow) for r in self._rows(sql)]

    def run(self, run: str) -> RunRow | None:
        found = [r for r in self.runs() if r.id == run]
        return found[0] if found else None

    def run_events(self, run: str) -> list[Event]:
        """The events recorded for `run`, in the order they were recorded (the report reads them);
        a kind this version does not know (a newer actor-run wrote it) is passed over."""
        found = []
        for row in self._rows("SELECT body FROM events WHERE run=? ORDER BY id", (run,)):
            try:
                found.append(decode_event(row["body"]))
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
    queued: int = 0  # waiting for a worker (a shared ledger)
    held: int = 0  # running under a live owner's lease (a shared ledger)
