"""Cancel from another process (`actor-run cancel`): the request is a row in `cancels`, one per job
(its run and key); every controller reads the rows after the last one it saw, once a poll, and
cancels the jobs it runs (the attempt is stopped, the machine deleted, the job ends `canceled`).
A job nobody runs (queued on a shared ledger, or its controller dead) is ended here, in the ledger,
so that no worker claims it and no resume takes it over.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from actor_run.supervisors.ledger.db import open_backend

ENDED = ("succeeded", "failed")


def _write(location: str | Path, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    backend = open_backend(location)
    conn = backend.connect()
    try:
        conn.execute(backend.begin_sql())
        for sql, args in statements:
            conn.execute(sql, args)
        conn.execute("COMMIT")
    finally:
        conn.close()
        backend.close()


def request_cancels(location: str | Path, jobs: list[tuple[str, str]], detail: str) -> None:
    """Ask whoever runs each job (run, key) to cancel it."""
    now = time.time()
    _write(location, [("INSERT INTO cancels (t, run, job, detail) VALUES (?,?,?,?)", (now, run, key, detail))
                      for run, key in jobs])


def end_unowned(location: str | Path, jobs: list[tuple[str, str, str, int]], detail: str) -> None:
    """End jobs (run, key, name, seed) nobody runs as `canceled` (queued ones, or a dead
    controller's), unless they ended; their machines are no longer kept for a resume, so the sweep
    deletes them (their owner is dead)."""
    now = time.time()
    statements: list[tuple[str, tuple[Any, ...]]] = []
    for run, key, name, seed in jobs:
        statements.append(("UPDATE jobs SET state='failed', failure='canceled', detail=?, updated=?"
                           " WHERE run=? AND key=? AND state NOT IN ('succeeded', 'failed')", (detail, now, run, key)))
        statements.append(("UPDATE machines SET resumable=0 WHERE run=? AND job=? AND seed=? AND state='alive'",
                           (run, name, seed)))
    _write(location, statements)


def last_cancel(conn: Any) -> int:
    """The id of the newest cancel request (0: none): a controller starts reading after it."""
    row = conn.execute("SELECT max(id) FROM cancels").fetchone()
    return int(row[0] or 0)


def cancels_after(conn: Any, last: int) -> list[tuple[int, str, str, str]]:
    """Cancel requests after the id `last`: (id, run, job key, detail), oldest first."""
    rows = conn.execute("SELECT id, run, job, detail FROM cancels WHERE id > ? ORDER BY id", (last,)).fetchall()
    return [(int(r[0]), str(r[1]), str(r[2]), str(r[3] or "")) for r in rows]


__all__ = ["cancels_after", "end_unowned", "last_cancel", "request_cancels"]
