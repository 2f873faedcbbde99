"""The ledger's writer: the durable record of owners, runs, jobs, attempts, machines and events, in
an SQLite file (WAL; the default) or a PostgreSQL database shared by many controllers (db.py says how
each is spoken to; schema.py how its tables come to be and are upgraded).

One writer thread per process owns the write connection and batches what it is handed into
transactions in the order they were queued (batch.py runs a batch); on PostgreSQL each transaction
is fenced first (`LedgerCore._fence`). This module is that machinery: the commit, the fencing,
the riding out of a database outage (queue.py holds what it is handed: the queue, `Waiter`, which
says when one write is durable, and `FileWrite`, a job's file written behind the fence). What is
written lives beside it, one module per kind of record (runs.py, attempts.py, machines.py,
money.py), each a part of `Ledger` (writer.py); reader.py reads it all back.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from actor_run.actors.base import failure_text
from actor_run.protocols.logs import logger
from actor_run.supervisors.ledger.db import LedgerError, open_backend
from actor_run.supervisors.ledger.queue import FileWrite, StaleClaim, Waiter, _ConnectionLost, _WriteQueue
from actor_run.supervisors.ledger.txn import Op, _run, _run_all

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
    (on the writer thread: it must only hand the news on).

    A ledger outage is not a failure (fenced backends): when the connection is lost (the server
    restarted, failed over, or the network cut), the batch in hand and every write queued after it
    are held, in order, while the writer reconnects with backoff for up to `outage_s`; once back,
    its first statement renews this owner's lease (if it has not expired), then the held writes go
    in. Only a lease that expired meanwhile, or an outage longer than `outage_s` (the lease cannot
    be proven then), stops the writing: the jobs go to the controllers that adopt them, their
    machines untouched. Meanwhile the attempts go on: nothing but a waited write waits.

    A batch whose COMMIT was cut may have committed: doing it again must leave what doing it once
    does. Claims are written so (a claim already made by this controller counts as won); an event
    row may then be recorded twice."""

    def __init__(self, path: str | Path, owner: str, run: str = "", *, lease_s: float = 60.0,
                 outage_s: float | None = None) -> None:
        self.backend = open_backend(path)
        self.path = self.backend.location
        self.owner = owner
        self.run = run  # the run a job goes to unless record_job names another (the Runner's own)
        self._run_of: dict[str, str] = {}  # job key -> its run, for the rows written about that job
        self.lease_s = lease_s
        self.tokens: dict[str, str] = {}  # job key -> the fencing token this controller claimed it with
        self.stale: set[str] = set()  # job keys this controller lost
        self.lease_lost = False
        # how long a lost connection is retried, holding the writes, before the lease counts as lost
        self.outage_s = lease_s if outage_s is None else outage_s
        self.outage_since: float | None = None  # monotonic time the connection was lost, while it is
        self.outages = 0  # connections lost and got back
        self.on_stale: Callable[[set[str]], None] | None = None
        # told once, on the writer thread, when a write failed for a reason that is not the database's
        # (`_commit_guarded`): it must only hand the news on
        self.on_failure: Callable[[BaseException], None] | None = None
        self.failure: BaseException | None = None
        self._machine_jobs: dict[str, str] = {}  # machine name -> job key (fences the machine's writes)
        self._conn = self.backend.connect()
        self._queue: _WriteQueue[_Item | None] = _WriteQueue()
        self._thread = threading.Thread(target=self._write_loop, name="actor-run-ledger", daemon=True)
        self._closed = False
        self.writes = 0
        self.commits = 0
        self.commit_s = 0.0  # seconds the commits took, in all (a worker's metrics: the write latency)
        self.renewals = 0  # lease renewals written (a shared ledger), and when the last one was
        self.renewed_at: float | None = None
        self._thread.start()

    # --- the writer thread -----------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            items = self._queue.take(1000)
            batch: list[_Item] = []
            for item in items:
                if item is None:  # close(): what came before it is committed, nothing after it is queued
                    if batch:
                        self._commit_guarded(batch)
                    return
                batch.append(item)
            self._commit_guarded(batch)

    def _commit_guarded(self, batch: list[_Item]) -> None:
        """`_commit`, but a failure that is not the database's (a value no column holds: an int past
        64 bits is an OverflowError, not a database error) never kills the writer thread: a dead
        writer left every waiter waiting and the controller deaf to SIGINT and SIGTERM. The batch's
        waiters get the error, `failure` keeps it, `on_failure(exc)` is told once (the Runner ends
        its run: machines deleted, exit 1), and the writes after it go on being made."""
        try:
            self._commit(batch)
        except Exception as exc:
            logger.bind(traceback=True).error("the ledger's writer failed:\n{}", failure_text(*sys.exc_info()))
            with contextlib.suppress(*self.backend.errors):
                if self.backend.in_transaction(self._conn):
                    self._conn.execute("ROLLBACK")
            for item in batch:
                if item[1] is not None and not item[1].done.is_set() and item[1].error is None:
                    item[1].error = LedgerError(f"the ledger's writer failed: {type(exc).__name__}: {exc}")
            self._finish([item for item in batch if item[1] is None or not item[1].done.is_set()])
            first = self.failure is None
            self.failure = exc
            if first and self.on_failure is not None:
                try:
                    self.on_failure(exc)
                except Exception:  # the writer thread must live on
                    logger.bind(traceback=True).error("a ledger failure callback failed:\n{}",
                                                      failure_text(*sys.exc_info()))

    def _commit(self, batch: list[_Item]) -> None:
        if self.backend.fenced:
            self._commit_fenced(batch)
        else:
            with contextlib.suppress(_ConnectionLost):  # (SQLite has no connection to lose)
                self._commit_once(batch)

    def _commit_fenced(self, batch: list[_Item]) -> None:
        """The batch, through connection losses: reconnect with backoff (renewing the lease first),
        holding this batch and everything queued after it, for up to `outage_s`."""
        delay = 0.05
        lost: tuple[type[BaseException], ...] = (_ConnectionLost, LedgerError, *self.backend.errors)
        while True:
            if self.lease_lost:  # dead for everyone: nothing more is written, nothing is asked
                self._refuse(batch, "(its lease expired)")
                return
            try:
                if getattr(self._conn, "closed", False):
                    self._conn = self.backend.connect()
                    self._renew_first()
                self._commit_once(batch)
            except lost as exc:
                now = time.monotonic()
                if self.outage_since is None:
                    self.outage_since = now
                    logger.warning("the ledger {} cannot be reached ({}); holding its writes in order and retrying "
                                   "for up to {:g} s while the jobs go on", self.backend.describe(),
                                   str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                                   self.outage_s)
                if now - self.outage_since > self.outage_s:
                    self._lose_lease(f"the ledger could not be reached for {self.outage_s:g} s")
                    continue
                time.sleep(delay)  # the writer thread's own backoff: nothing else waits on it
                delay = min(delay * 2, 1.0)
                continue
            if self.outage_since is not None:
                logger.warning("the ledger is back after {:.1f} s; the held writes are in",
                               time.monotonic() - self.outage_since)
                self.outage_since = None
                self.outages += 1
            return

    def _renew_first(self) -> None:
        """On a new connection after a loss, before any held write: renew the lease, unless it
        expired meanwhile (then another controller may have taken the jobs: the lease is lost)."""
        now_sql = self.backend.now_sql
        cur = self._conn.execute(
            f"UPDATE owners SET beat=?, lease_until={now_sql} + ? WHERE id=? AND closed=0 AND lease_until > {now_sql}",
            (time.time(), self.lease_s, self.owner))
        if cur.rowcount != 1:
            self._lose_lease("its lease expired while the ledger could not be reached")

    def _lose_lease(self, why: str) -> None:
        if self.lease_lost:
            return
        self.lease_lost = True
        lost = set(self.tokens) - self.stale
        logger.error("this controller's lease in the ledger is lost ({}): it writes nothing more and lets its jobs "
                     "go to the controllers that adopt them", why)
        self._tell_stale(lost)

    def _tell_stale(self, lost: set[str]) -> None:
        if not lost:
            return
        self.stale |= lost
        if self.on_stale is not None:
            try:
                self.on_stale(lost)
            except Exception:  # the writer thread must live on
                logger.bind(traceback=True).error("a ledger stale-claim callback failed:\n{}",
                                                  failure_text(*sys.exc_info()))

    def _refuse(self, batch: list[_Item], why: str = "") -> None:
        for item in batch:
            if item[1] is not None and item[1].error is None:
                item[1].error = StaleClaim(f"{item[2] or 'this write'} is no longer this controller's to make"
                                           + (f" {why}" if why else ""))
        self._finish(batch)

    def _broken(self) -> bool:
        return bool(self.backend.fenced and getattr(self._conn, "closed", False))

    def _commit_once(self, batch: list[_Item]) -> None:
        """One transaction for the batch. If an op fails, the batch is done again with a savepoint
        per op, so only that one is rolled back and its waiter gets the error (savepoints cost
        three statements per op: only when needed). The writer thread never dies of one bad write.
        A lost connection raises _ConnectionLost with no waiter told: the batch is done again."""
        conn, errors = self._conn, self.backend.errors
        refused: list[_Item] = []
        began = time.monotonic()
        try:
            conn.execute(self.backend.begin_sql())
            if self.backend.fenced:
                self._renew_lease()
                batch, refused = self._fence(batch)
            try:
                _run_all(conn, [op for op, _, _ in batch if not isinstance(op, FileWrite)])
            except errors:  # an op failed: redo the batch so that only that one fails
                conn.execute("ROLLBACK")
                self._commit_one_by_one(batch + refused)
                return
            conn.execute("COMMIT")
            self.commits += 1
            self.commit_s += time.monotonic() - began
        except errors as exc:  # BEGIN or COMMIT itself (disk full, locked for 30 s, the server gone)
            if self._broken():
                raise _ConnectionLost(str(exc)) from exc
            self._failed(batch, exc)
        self._after_commit(batch)
        self._finish(batch + refused)

    def _renew_lease(self) -> None:
        """Every transaction first renews this owner's lease, if it still holds (an expired lease is
        never renewed: another controller may have taken its jobs). The owner's beat alone is a write
        queued behind the others: behind the thousands of a start burst it came after the lease ran
        out, and three workers of 3,000 attempts each lost theirs (bench/RESULTS.md, scale out)."""
        if not self.lease_lost:
            self._conn.execute(
                f"UPDATE owners SET beat=?, lease_until={self.backend.now_sql} + ? WHERE id=? AND closed=0"
                f" AND (lease_until IS NULL OR lease_until > {self.backend.now_sql})",
                (time.time(), self.lease_s, self.owner))
            self.renewals += 1
            self.renewed_at = time.time()

    def _after_commit(self, batch: list[_Item]) -> None:
        """The files of the jobs the committed transaction fenced may be written now (queue order)."""
        for op, _, _ in batch:
            if isinstance(op, FileWrite):
                try:
                    op.write()
                except OSError as exc:  # a full disk must not stop the writer thread
                    logger.error("could not write a job's file: {}", exc)

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
                self._lose_lease("it expired: this process was frozen, or cut off from the ledger")
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
        self._tell_stale(lost)
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

    def _commit_one_by_one(self, batch: list[_Item]) -> None:
        conn, errors = self._conn, self.backend.errors
        refused: list[_Item] = []
        try:
            conn.execute(self.backend.begin_sql())
            if self.backend.fenced:
                self._renew_lease()
                batch, refused = self._fence(batch)
            failed: list[tuple[Waiter, Exception]] = []
            for op, waiter, _ in batch:
                if isinstance(op, FileWrite):
                    continue
                conn.execute("SAVEPOINT op")
                try:
                    _run(conn, op)
                    conn.execute("RELEASE op")
                except errors as exc:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    logger.error("ledger write failed: {}", exc)
                    if waiter is not None:
                        failed.append((waiter, exc))
            conn.execute("COMMIT")
            self.commits += 1
            for waiter, error in failed:
                waiter.error = error
        except errors as exc:
            if self._broken():
                raise _ConnectionLost(str(exc)) from exc
            self._failed(batch, exc)
        self._after_commit(batch)
        self._finish(batch + refused)

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

    def _submit(self, op: Op, *, wait: bool = False, fence: str | None = None, first: bool = False) -> None:
        """Queue a write; with `wait`, return only once it is committed (or raise LedgerError).
        `first`: ahead of every write queued (`_queue_op`)."""
        waiter = self._queue_op(op, tracked=wait, fence=fence, first=first)
        if waiter is not None:
            waiter.wait()

    def _track(self, op: Op, fence: str | None = None) -> Waiter:
        """Queue a write; its Waiter says when it is durable."""
        waiter = self._queue_op(op, tracked=True, fence=fence)
        assert waiter is not None
        return waiter

    def _queue_op(self, op: Op, *, tracked: bool, fence: str | None = None, first: bool = False) -> Waiter | None:
        """Queue a write without waiting; `tracked` returns the Waiter that says when it is durable.
        Writes commit in the order they were queued, but one queued `first`: it goes into the next
        transaction, ahead of those waiting (only for a write that no write queued before it is
        about: a claim of another owner's jobs, which waited 25-30 s behind a start burst's
        thousands of writes while the dead worker's jobs stayed unadopted; bench/scaleout.py).
        `fence`: the job key whose claim this write needs (on a fenced backend it is not made once
        the claim is lost)."""
        if self._closed:
            raise LedgerError("the ledger is closed")
        waiter = Waiter() if tracked else None
        item = (op, waiter, fence if fence in self.tokens else None)
        self._queue.put(item, first=first)
        return waiter

    def _machine_fence(self, name: str) -> str | None:
        return self._machine_jobs.get(name)

    # --- fencing the job's files ---------------------------------------------------------------------

    def write_file(self, key: str, write: Callable[[], object]) -> None:
        """Run `write`, which writes the job `key`'s files (log bytes, response.json), only while
        this controller holds the job. Without fencing (SQLite, or a job not claimed here), at once
        on this thread. On a shared ledger it is queued with the job's rows and run on the writer
        thread just after the transaction that proved the claim (lease and token, under share locks
        that keep an adopter's claim waiting) commits: in order, held while the database is away,
        never once the claim is lost (a frozen worker that wakes past its lease writes nothing)."""
        if not self.backend.fenced or key not in self.tokens:
            write()
            return
        if key in self.stale or self.lease_lost or self._closed:
            return
        self._queue.put((FileWrite(write), None, key))

    def check_job(self, key: str) -> Waiter | None:
        """A no-op write fenced by the job `key`: once done, `may_write(key)` says what the database
        said. None when there is nothing to ask (no fencing, or a job not claimed here)."""
        if not self.backend.fenced or key not in self.tokens or self._closed:
            return None
        return self._track(lambda c: None, key)

    def may_write(self, key: str) -> bool:
        """Whether this controller still holds the job `key` (what this process knows now)."""
        return not self.backend.fenced or key not in self.tokens or (key not in self.stale and not self.lease_lost)

    def hand_back(self) -> set[str]:
        """Let go of every job held here (a worker stopped by SIGTERM): nothing more is written about
        them, in the ledger or in their files, and their machines are left to the adopter. Returns
        their keys; `close_owner` then tells the other workers to adopt them."""
        keys = set(self.tokens) - self.stale
        self.stale |= keys
        return keys

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
