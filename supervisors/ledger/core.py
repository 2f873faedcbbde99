"""The ledger's writer: the durable record of owners, runs, jobs, attempts, machines and events, in
an SQLite file (WAL; the default) or a PostgreSQL database shared by many controllers (db.py says how
each is spoken to; schema.py how its tables come to be and are upgraded).

One writer thread per process owns the write connection and batches what it is handed into
transactions in the order they were queued (batch.py runs a batch); on PostgreSQL each transaction
is fenced first (`LedgerCore._fence`). This module is that machinery: the queue, the commit, the
fencing, and `Waiter`, which says when one write is durable. What is written lives beside it, one
module per kind of record (runs.py, attempts.py, machines.py, money.py), each a part of `Ledger`
(writer.py); reader.py reads it all back.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from loguru import logger

from actor_run.actors.base import failure_text
from actor_run.actors.flag import Flag
from actor_run.actors.pool import blocking
from actor_run.supervisors.ledger.batch import Op, _run, _run_all
from actor_run.supervisors.ledger.db import LedgerError, open_backend

T = TypeVar("T")


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
                logger.bind(traceback=True).error("a ledger commit callback failed:\n{}", failure_text(*sys.exc_info()))


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


class LedgerCore:
    """The write side's machinery: one thread, one connection, batched transactions (`Ledger`
    adds the records).

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
                    logger.bind(traceback=True).error("a ledger stale-claim callback failed:\n{}",
                                                      failure_text(*sys.exc_info()))
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


    def run_of(self, key: str) -> str:
        """The run the job `key` belongs to in this controller (record_job or take_job said so)."""
        return self._run_of.get(key, self.run)
