"""The GIL convoy: small file and SQLite calls from one thread while another thread computes.

Every call that lets go of the GIL (a file system call, each row sqlite3 steps) waits to get it
back until the computing thread gives it up: up to the switch interval (5 ms). Measured here,
each beside one busy thread and alone:

  (a) files: for each of `--items` jobs, a folder and two small files (what a fetch leaves);
  (b) SQLite: `--rows` event rows in one transaction, through `executemany` against the ledger's
      multi-row statements (`supervisors/ledger/txn.py: _run_many`).

Prints a table, then as its last line one JSON object with the times in ms and
{"files_slowdown": busy / alone, "sqlite_ratio": executemany / multi-row beside the busy thread}.

    python bench/convoy.py [--items 100] [--rows 200]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actor_run.supervisors.ledger.txn import _run_many

FILES = {"out/result.txt": b"a result\n", "response.json": b'{"exit_code": 0}\n'}
EVENT_SQL = "INSERT INTO events (t, job, seed, type, body) VALUES (?,?,?,?,?)"


@contextmanager
def busy_thread() -> Iterator[None]:
    """A thread that computes (never waits) until the block ends."""
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    time.sleep(0.05)  # until it runs: its first turn at the GIL is not the steady state measured
    try:
        yield
    finally:
        stop.set()
        t.join()


def write_files(root: str, items: int) -> None:
    for i in range(items):
        for rel, data in FILES.items():
            path = os.path.join(root, f"job-{i}", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)


def sqlite_rows(rows: int) -> list[tuple[object, ...]]:
    return [(time.time(), "job/seed-1", i, "Leased", '{"machine": "m"}') for i in range(rows)]


def insert_many(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(EVENT_SQL, rows)
    conn.execute("COMMIT")


def insert_multi_row(conn: sqlite3.Connection, rows: list[tuple[object, ...]]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    _run_many(conn, EVENT_SQL, rows)
    conn.execute("COMMIT")


def timed_ms(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100, help="jobs whose folder and two files are written")
    ap.add_argument("--rows", type=int, default=200, help="SQLite rows in one transaction")
    args = ap.parse_args()
    if args.items < 1 or args.rows < 1:
        ap.error("--items and --rows must be at least 1")
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="actor-run-convoy-") as tmp:
        out["files_alone_ms"] = timed_ms(lambda: write_files(tempfile.mkdtemp(dir=tmp), args.items))
        with busy_thread():
            out["files_busy_ms"] = timed_ms(lambda: write_files(tempfile.mkdtemp(dir=tmp), args.items))
        conn = sqlite3.connect(os.path.join(tmp, "ledger.sqlite"), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE events (t REAL, job TEXT, seed INTEGER, type TEXT, body TEXT)")
        rows = sqlite_rows(args.rows)
        for label, insert in (("executemany", insert_many), ("multirow", insert_multi_row)):
            out[f"sqlite_{label}_alone_ms"] = timed_ms(functools.partial(insert, conn, rows))
            with busy_thread():
                out[f"sqlite_{label}_busy_ms"] = timed_ms(functools.partial(insert, conn, rows))
        conn.close()
    out = {k: round(v, 1) for k, v in out.items()}
    out["files_slowdown"] = round(out["files_busy_ms"] / out["files_alone_ms"], 1)
    out["sqlite_ratio"] = round(out["sqlite_executemany_busy_ms"] / out["sqlite_multirow_busy_ms"], 1)
    print(f"{'':40s} {'alone':>10s} {'beside a busy thread':>22s}")
    print(f"{f'(a) {args.items} x (folder + 2 files)':40s} {out['files_alone_ms']:8.1f} ms"
          f" {out['files_busy_ms']:20.1f} ms")
    print(f"{f'(b) {args.rows} rows, executemany':40s} {out['sqlite_executemany_alone_ms']:8.1f} ms"
          f" {out['sqlite_executemany_busy_ms']:20.1f} ms")
    print(f"{'    the same as multi-row statements':40s} {out['sqlite_multirow_alone_ms']:8.1f} ms"
          f" {out['sqlite_multirow_busy_ms']:20.1f} ms")
    print(f"files {out['files_slowdown']}x slower beside a busy thread; "
          f"sqlite: executemany / multi-row beside it {out['sqlite_ratio']}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
