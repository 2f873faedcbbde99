"""What the ledger records of runs and jobs: a run started, taken, ended; a job recorded, claimed
(from a dead owner, or queued on a shared ledger: each claim with a fresh fencing token), ended."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import uuid

import msgspec

from actor_run.protocols.redact import redact
from actor_run.supervisors.ledger.core import _RECORD_JOB, LedgerCore
from actor_run.supervisors.ledger.db import Conn
from actor_run.supervisors.ledger.queue import StaleClaim, Waiter


class Claimed(msgspec.Struct, frozen=True, kw_only=True):
    """A queued job this controller claimed: its run, key, spec (secrets redacted), fencing token
    and the seed folder its run said its results go to."""

    run: str
    key: str
    spec: bytes
    token: str
    out_dir: str | None



_TOKEN_BASE = uuid.uuid4().hex[:16]  # random once per process (the pid tells a fork's apart)
_token_ids = itertools.count()


def fresh_token() -> str:
    """A fencing token no other claim has: this process's random base, its pid and a count. (A
    uuid4 per job drew from the system's random source each time: a third of the main thread's time
    submitting 3,000 jobs, each draw a wait for the GIL: bench/RESULTS.md.)"""
    return f"{_TOKEN_BASE}{os.getpid():x}.{next(_token_ids)}"


class RunRecords(LedgerCore):
    """The ledger's writes about runs and jobs (a part of `Ledger`)."""

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
        with contextlib.suppress(StaleClaim):  # its lease ran out meanwhile (a starved process): it writes nothing
            self._submit(("UPDATE runs SET ended=?, state='ended' WHERE id=? AND owner=?", row), wait=True)

    def claim_job(self, key: str, from_owner: str, run: str | None = None) -> bool:
        """Take a dead owner's unfinished job of `run` (compare-and-set: one resumer wins), with a
        fresh fencing token; the job's later rows go to that run."""
        won: list[bool] = []
        owner, now, run, token = self.owner, time.time(), self.run if run is None else run, fresh_token()

        def op(c: Conn) -> None:
            # (or token=?: this very claim, committed by a try whose COMMIT answer was cut, counts as won)
            cur = c.execute("UPDATE jobs SET owner=?, updated=?, token=? WHERE run=? AND key=?"
                            " AND (owner=? OR token=?) AND state='running'", (owner, now, token, run, key, from_owner,
                                                                            token))
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

    def claim_jobs(self, wanted: list[tuple[str, str, str]]) -> set[str]:
        """`claim_job` for each (key, from_owner, run), all in one transaction (one round trip for a
        dead worker's many jobs: an adopter at full concurrency takes them in one go); the keys won."""
        if not wanted:
            return set()
        owner, now = self.owner, time.time()
        tokens = {key: uuid.uuid4().hex for key, _, _ in wanted}
        won: list[set[str]] = []

        def op(c: Conn) -> None:
            got = set()
            if self.backend.fenced:  # one statement for them all: 3,000 updates one by one took seconds
                keys, froms, runs = (list(col) for col in zip(*wanted, strict=True))
                rows = c.execute(
                    "UPDATE jobs j SET owner=?, updated=?, token=w.token FROM (SELECT unnest(?::text[]) AS run,"
                    " unnest(?::text[]) AS key, unnest(?::text[]) AS from_owner, unnest(?::text[]) AS token) w"
                    " WHERE j.run = w.run AND j.key = w.key AND (j.owner = w.from_owner OR j.token = w.token)"
                    " AND j.state='running' RETURNING j.key",
                    (owner, now, runs, keys, froms, [tokens[k] for k in keys])).fetchall()
                got = {r[0] for r in rows}
            else:
                for key, from_owner, run in wanted:
                    cur = c.execute("UPDATE jobs SET owner=?, updated=?, token=? WHERE run=? AND key=?"
                                    " AND (owner=? OR token=?) AND state='running'",
                                    (owner, now, tokens[key], run, key, from_owner, tokens[key]))
                    if cur.rowcount == 1:
                        got.add(key)
            won.append(got)

        try:
            # ahead of this controller's own queued writes: none of them is about these jobs (another
            # owner's), and behind a start burst's thousands they waited 25-30 s (bench/scaleout.py)
            self._submit(op, wait=True, first=True)
        except StaleClaim:
            return set()
        got = won[-1] if won else set()  # the last run of the op is the one committed
        for key, _, run in wanted:
            if key in got:
                self._run_of[key] = run
                self.tokens[key] = tokens[key]
                self.stale.discard(key)
        return got

    def put_back(self, jobs: list[tuple[str, str]]) -> None:
        """Queued again, at the queue's end, for another worker: jobs (run, key) claimed here that
        this controller cannot run (no cloud they name can be used here); their tokens dropped."""
        if not jobs:
            return
        owner, now = self.owner, time.time()

        def op(c: Conn) -> None:
            for run, key in jobs:
                c.execute("UPDATE jobs SET state='queued', updated=?, token=NULL WHERE run=? AND key=? AND owner=?"
                          " AND state='running'", (now, run, key, owner))

        with contextlib.suppress(StaleClaim):  # its lease ran out meanwhile: an adopter has them
            self._submit(op, wait=True)
        for _, key in jobs:
            self.tokens.pop(key, None)
            self._run_of.pop(key, None)

    def claim_queued(self, most: int, run: str | None = None) -> list[Claimed]:
        """Claim up to `most` queued jobs of `run` or of any run, oldest first, each with a fresh
        fencing token. On PostgreSQL, controllers claiming at once skip each other's rows (FOR UPDATE
        SKIP LOCKED); SQLite has one writer at a time."""
        if most < 1:
            return []
        got: list[list[Claimed]] = []
        owner, now, prefix = self.owner, time.time(), fresh_token() + ":"
        lock = " FOR UPDATE SKIP LOCKED" if self.backend.fenced else ""
        of_run, picked = (" AND run=?", (run,)) if run is not None else ("", ())

        def op(c: Conn) -> None:
            # this very claim, committed by a try whose COMMIT answer was cut (a ledger outage): those
            # rows are this controller's already, and claiming more would leave them unrun
            rows = c.execute("SELECT run, key, spec, token, out_dir FROM jobs WHERE owner=? AND state='running'"
                             " AND token LIKE ?", (owner, prefix + "%")).fetchall()
            if rows:
                got.append([Claimed(run=r[0], key=r[1], spec=bytes(r[2]), token=r[3], out_dir=r[4]) for r in rows])
                return
            rows = c.execute(
                "UPDATE jobs SET owner=?, state='running', updated=?, token=? || run || '/' || key"
                " WHERE (run, key) IN ("
                f"SELECT run, key FROM jobs WHERE state='queued'{of_run} ORDER BY updated, run, key LIMIT ?{lock})"
                " RETURNING run, key, spec, token, out_dir", (owner, now, prefix, *picked, most)).fetchall()
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

    def record_job(self, *, key: str, name: str, seed: int, spec: bytes, state: str, out_dir: str,
                   run: str | None = None) -> None:
        """The job, in `run` (default: this ledger's run), this controller's from now on with a
        fresh fencing token; its later rows go to that run."""
        run = self.run if run is None else run
        self._run_of[key] = run
        token = fresh_token()
        self.tokens[key] = token
        self.stale.discard(key)
        row = (run, key, name, seed, self.owner, spec, state, out_dir, time.time(), token)
        # no wait: the queue is FIFO, so the intent of any machine for it commits after it
        self._submit((_RECORD_JOB, row))

    def record_job_end(self, *, key: str, state: str, failure: str | None, detail: str, attempts: int,
                       usd: float) -> Waiter:
        """Queued; the Waiter says when it is durable (the job's handle resolves then)."""
        now, run = time.time(), self.run_of(key)
        ended = ("UPDATE jobs SET state=?, failure=?, detail=?, attempts=?, usd=?, updated=? WHERE run=? AND key=?",
                 (state, failure, redact(detail)[:1000], attempts, usd, now, run, key))
        if not self.backend.fenced:
            return self._track(ended, key)

        def op(c: Conn) -> None:
            # a shared run ends with its last job, whoever ran it (its submitter may be long gone); the
            # run's row locked first, so of two workers ending its last two jobs the later one sees both
            c.execute("SELECT id FROM runs WHERE id=? FOR UPDATE", (run,))
            c.execute(*ended)
            c.execute("UPDATE runs SET ended=?, state='ended' WHERE id=? AND ended IS NULL AND NOT EXISTS"
                      " (SELECT 1 FROM jobs WHERE run=? AND state IN ('queued', 'running'))", (now, run, run))

        return self._track(op, key)
