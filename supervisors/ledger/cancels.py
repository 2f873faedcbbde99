"""Cancel from another process (`actor-run cancel`): the request is a row in `cancels`, one per job
(its run and key); every controller reads the rows after the last one it saw, once a poll, and
cancels the jobs it runs (the attempt is stopped, the machine deleted, the job ends `canceled`).
A job nobody runs (queued on a shared ledger, or its controller dead) is ended here, in the ledger,
so that no worker claims it and no resume takes it over.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actor_run.supervisors.ledger.db import Conn, open_backend

ENDED = ("succeeded", "failed")


@contextlib.contextmanager
def _transaction(location: str | Path) -> Iterator[Conn]:
    """One transaction on the ledger at `location`, committed if the block ends without raising
    (closed uncommitted otherwise: nothing of it is kept)."""
    backend = open_backend(location)
    conn = backend.connect()
    try:
        conn.execute(backend.begin_sql())
        yield conn
        conn.execute("COMMIT")
    finally:
        conn.close()
        backend.close()


def request_cancels(location: str | Path, jobs: list[tuple[str, str]], detail: str) -> None:
    """Ask whoever runs each job (run, key) to cancel it."""
    now = time.time()
    with _transaction(location) as conn:
        for run, key in jobs:
            conn.execute("INSERT INTO cancels (t, run, job, detail) VALUES (?,?,?,?)", (now, run, key, detail))


def end_unowned(location: str | Path, jobs: list[tuple[str, str, str, int, str, str | None]],
                detail: str) -> set[tuple[str, str]]:
    """End jobs (run, key, name, seed, state, owner) nobody runs as `canceled` (queued ones, or a
    dead controller's), each only while it is as it was read (that state, that owner): a queued job
    a worker claimed meanwhile is that worker's to cancel. Their machines are no longer kept for a
    resume, so the sweep deletes them (their owner is dead). Answers the (run, key) ended here."""
    now = time.time()
    ended: set[tuple[str, str]] = set()
    with _transaction(location) as conn:
        for run, key, name, seed, state, owner in jobs:
            same = "owner IS NULL" if owner is None else "owner=?"
            cur = conn.execute("UPDATE jobs SET state='failed', failure='canceled', detail=?, updated=?"
                               f" WHERE run=? AND key=? AND state=? AND {same}",
                               (detail, now, run, key, state, *(() if owner is None else (owner,))))
            if cur.rowcount != 1:
                continue
            ended.add((run, key))
            conn.execute("UPDATE machines SET resumable=0 WHERE run=? AND job=? AND seed=? AND state='alive'",
                         (run, name, seed))
    return ended


def last_cancel(conn: Any) -> int:
    """The id of the newest cancel request (0: none): a controller starts reading after it."""
    row = conn.execute("SELECT max(id) FROM cancels").fetchone()
    return int(row[0] or 0)


def cancels_after(conn: Any, last: int) -> list[tuple[int, str, str, str]]:
    """Cancel requests after the id `last`: (id, run, job key, detail), oldest first."""
    rows = conn.execute("SELECT id, run, job, detail FROM cancels WHERE id > ? ORDER BY id", (last,)).fetchall()
    return [(int(r[0]), str(r[1]), str(r[2]), str(r[3] or "")) for r in rows]


__all__ = ["cancels_after", "end_unowned", "last_cancel", "request_cancels"]
