"""supervisors/ledger/: one writer thread, readers of their own, on both backends (SQLite in WAL
mode, PostgreSQL): every test that takes `db` runs once against each."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.waits import poll

from actor_run.protocols.failures import Code
from actor_run.protocols.messages import JobEnded, Leased, LeaseFailed, Machine, decode_event
from actor_run.supervisors.ledger import (
    Ledger,
    LedgerError,
    LedgerReader,
    OwnerRow,
    StaleClaim,
    owner_is_alive,
    process_start_time,
)
from actor_run.supervisors.ledger.cancels import end_unowned
from actor_run.supervisors.ledger.txn import _run, _run_all, _run_many


class Db:
    """The test's own view of a ledger, as another process would have it: plain connections."""

    def __init__(self, location: str | Path) -> None:
        self.location = location
        self.postgres = isinstance(location, str)

    def _connect(self) -> Any:
        if self.postgres:
            import psycopg

            return psycopg.connect(str(self.location), autocommit=True)
        return sqlite3.connect(self.location, isolation_level=None)

    def raw(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        conn = self._connect()
        try:
            if self.postgres:
                sql = sql.replace("?", "%s")
            cur = conn.execute(sql, args)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
        finally:
            conn.close()

    @contextmanager
    def writes_held(self) -> Iterator[None]:
        """Another connection holds the ledger's tables: the writer's transactions wait meanwhile."""
        conn = self._connect()
        try:
            if self.postgres:
                conn.execute("BEGIN")
                conn.execute("LOCK TABLE owners, jobs, machines, events, attempts IN EXCLUSIVE MODE")
            else:
                conn.execute("BEGIN IMMEDIATE")
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()


@pytest.fixture
def path(ledger_location: str | Path) -> str | Path:
    return ledger_location


@pytest.fixture
def db(path: str | Path) -> Db:
    return Db(path)


@pytest.fixture
def ledgers(path: str | Path) -> Iterator[Callable[..., Ledger]]:
    made: list[Ledger] = []

    def make(owner: str | None = None) -> Ledger:
        led = Ledger(path, owner or uuid.uuid4().hex)
        made.append(led)
        return led

    yield make
    for led in made:
        led.close()


@pytest.fixture
def reader(path: str | Path, ledgers: Callable[..., Ledger]) -> Iterator[LedgerReader]:
    ledgers()  # the file and its schema
    r = LedgerReader(path)
    yield r
    r.close()


def intent(led: Ledger, name: str = "ar-j-1-a0-0123abcd-d1", **kw: object) -> str:
    led.record_intent(
        name=name,
        cloud=str(kw.get("cloud", "sim")),
        job="j/seed-1",
        seed=1,
        attempt=0,
        deadline=float(kw.get("deadline", time.time() + 600)),
    )  # type: ignore[arg-type]
    return name


def test_the_sqlite_ledger_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path, "o").close()
    assert Db(path).raw("PRAGMA journal_mode") == [("wal",)]


def test_record_intent_is_durable_before_it_returns(db: Db, ledgers: Callable[..., Ledger]) -> None:
    led = ledgers("f" * 32)
    for i in range(20):  # every time, not by luck of the writer thread's timing
        name = intent(led, f"ar-j-1-a{i}-ffffffff-d1")
        assert db.raw("SELECT owner, state, phase FROM machines WHERE name=?", (name,)) == [
            ("f" * 32, "alive", "requested")
        ]


def test_a_machine_is_alive_until_its_deletion_is_confirmed(
    ledgers: Callable[..., Ledger], reader: LedgerReader
) -> None:
    led = ledgers()
    name = intent(led)
    led.record_launched(Machine(cloud="sim", id="sim-1", name=name, region="us-east", hourly_usd=1.8))
    led.record_started(name, "/work/j", 4242, 123.0)
    led.flush()
    row = reader.machine(name)
    assert row is not None
    assert (row.state, row.phase, row.machine_id, row.region, row.hourly_usd) == (
        "alive",
        "running",
        "sim-1",
        "us-east",
        1.8,
    )
    assert (row.work, row.pid, row.launched_at) == ("/work/j", 4242, 123.0)
    assert [m.name for m in reader.machines(alive_only=True)] == [name]
    led.record_gone(name, 456.0, "released")
    row = reader.machine(name)
    assert row is not None
    assert (row.state, row.phase, row.gone, row.reason) == ("deleted", "deleted", 456.0, "released")
    assert reader.machines(alive_only=True) == []
    assert [m.name for m in reader.machines()] == [name]


def test_a_failed_delete_keeps_the_machine_alive(ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    led = ledgers()
    name = intent(led)
    led.record_delete_failed(name, "provider said 503")
    row = reader.machine(name)
    assert row is not None
    assert (row.state, row.phase, row.detail) == ("alive", "delete_failed", "provider said 503")
    # a later confirmed deletion closes it; a late failure report does not reopen it
    led.record_gone(name, time.time(), "swept")
    led.record_delete_failed(name, "late")
    row = reader.machine(name)
    assert row is not None
    assert (row.state, row.phase, row.detail) == ("deleted", "deleted", None)


# --- owners ------------------------------------------------------------------------------------------


def _row(**kw: object) -> OwnerRow:
    base: dict[str, object] = {
        "id": "o",
        "pid": os.getpid(),
        "started": process_start_time(os.getpid()),
        "host": socket.gethostname(),
        "beat": time.time(),
        "closed": 0,
    }
    base.update(kw)
    return OwnerRow(**base)  # type: ignore[arg-type]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # exited and reaped: no process has this pid now
    return proc.pid


def test_a_live_pid_with_its_start_time_is_alive() -> None:
    assert owner_is_alive(_row(), now=time.time())


def test_a_dead_pid_is_not_alive() -> None:
    assert not owner_is_alive(_row(pid=_dead_pid()), now=time.time())


def test_a_reused_pid_is_not_alive() -> None:
    started = process_start_time(os.getpid())
    assert started is not None
    # same pid, but the process that registered started a minute earlier: another process now
    assert not owner_is_alive(_row(started=started - 60), now=time.time())


def test_an_exited_owner_nobody_reaped_is_not_alive() -> None:
    """A controller that exited and whose parent never reaps it (a container's PID 1, once its
    own parent is gone: a detached controller killed) is a zombie with its pid and start time."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = process_start_time(proc.pid)
        assert started is not None
        row = _row(pid=proc.pid, started=started)
        assert owner_is_alive(row, now=time.time())
        assert proc.stdin is not None
        proc.stdin.close()  # it exits; not reaped until the wait below
        end = time.monotonic() + 60
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < end, "the child did not exit"
            time.sleep(0.01)
        assert not owner_is_alive(row, now=time.time())
    finally:
        proc.kill()
        proc.wait()


def test_a_closed_owner_is_not_alive() -> None:
    assert not owner_is_alive(_row(closed=1), now=time.time())


def test_an_owner_on_another_host_is_alive_while_it_beats() -> None:
    now = time.time()
    assert owner_is_alive(_row(host="elsewhere", pid=_dead_pid(), beat=now - 30), now=now)
    assert not owner_is_alive(_row(host="elsewhere", beat=now - 601), now=now)


def test_registered_owners_are_alive_until_closed(
    ledgers: Callable[..., Ledger], reader: LedgerReader, db: Db
) -> None:
    a, b = ledgers(), ledgers()
    a.register_owner()
    b.register_owner()
    assert {a.owner, b.owner} <= reader.live_owners()
    b.close_owner()
    assert a.owner in reader.live_owners()
    assert b.owner not in reader.live_owners()
    # an owner row for a process that is gone (SQLite: its pid; PostgreSQL: its lease expired)
    db.raw(
        "INSERT INTO owners (id, pid, started, host, beat, closed, lease_until) VALUES (?,?,?,?,?,0,?)",
        ("dead", _dead_pid(), time.time(), socket.gethostname(), time.time(), time.time() - 1),
    )
    assert "dead" in {o.id for o in reader.owners()}
    assert "dead" not in reader.live_owners()


# --- jobs, attempts, events --------------------------------------------------------------------------


def test_events_are_stored_as_json_with_their_type(ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    led = ledgers()
    machine = Machine(cloud="sim", id="sim-1", name="ar-j-1-a0-0123abcd-d1")
    events = [
        Leased(job="j", seed=1, attempt=0, machine=machine),
        LeaseFailed(job="j", seed=1, attempt=1, failure=Code.NO_CAPACITY, detail="none left"),
        JobEnded(job="j", seed=1, attempt=1, outcome="failed", failure=Code.JOB_FAILED, attempts=2),
    ]
    for e in events:
        led.record_event(e)
    led.flush()
    rows = reader.events("j/seed-1")
    assert [r["type"] for r in rows] == ["Leased", "LeaseFailed", "JobEnded"]
    assert [r["attempt"] for r in rows] == [0, 1, 1]
    bodies = [json.loads(r["body"]) for r in rows]
    assert [b["type"] for b in bodies] == ["Leased", "LeaseFailed", "JobEnded"]
    assert bodies[1]["failure"] == "no_capacity"
    assert bodies[2]["failure"] == "job_failed"
    assert [decode_event(r["body"]) for r in rows] == events  # one schema: what was sent is what is read
    assert reader.events("other/seed-1") == []


def test_jobs_and_attempts(ledgers: Callable[..., Ledger], reader: LedgerReader, db: Db) -> None:
    led = ledgers()
    led.record_job(key="j/seed-1", name="j", seed=1, spec=b"{}", state="running", out_dir="/out/j/seed-1")
    led.record_attempt(
        job="j/seed-1",
        attempt=0,
        machine="m",
        cloud="sim",
        region="r",
        state="failed",
        failure="stalled",
        detail="quiet",
        started=1.0,
        ended=2.0,
        usd=0.5,
    )
    # queued: durable once its Waiter says so
    led.record_job_end(key="j/seed-1", state="failed", failure="stalled", detail="quiet", attempts=1, usd=0.5).wait()
    jobs = reader.jobs()
    assert len(jobs) == 1
    assert {k: jobs[0][k] for k in ("key", "owner", "state", "failure", "attempts", "usd")} == {
        "key": "j/seed-1",
        "owner": led.owner,
        "state": "failed",
        "failure": "stalled",
        "attempts": 1,
        "usd": 0.5,
    }
    assert db.raw("SELECT job, attempt, state, failure FROM attempts") == [("j/seed-1", 0, "failed", "stalled")]


def test_clouds_are_remembered_once(ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    led = ledgers()
    led.record_cloud("sim", {"launch_latency_s": 0})
    led.record_cloud("sim", {"launch_latency_s": 0})
    led.record_cloud("local", {})
    assert sorted(reader.clouds()) == [("local", {}), ("sim", {"launch_latency_s": 0})]


def test_a_closed_ledger_refuses_writes(ledgers: Callable[..., Ledger]) -> None:
    led = ledgers()
    led.close()
    with pytest.raises(LedgerError, match="closed"):
        intent(led)
    led.close()  # twice is fine


def test_a_bad_write_fails_alone_and_the_rest_of_its_batch_commits(
    db: Db, ledgers: Callable[..., Ledger], reader: LedgerReader,
) -> None:
    led = ledgers()
    name = intent(led)
    # another connection holds the write lock: the writes below queue up and commit together
    with db.writes_held():
        bad = led._queue_op(("INSERT INTO no_such_table (x) VALUES (?)", (1,)), tracked=True)
        gone = led.queue_gone(name, 456.0, "deleted")
        other = led.queue_intent(name="m-other", cloud="sim", job="j/seed-2", seed=2, attempt=0, deadline=1.0)
        time.sleep(0.2)  # the lock held a while on purpose: the writer gathers the three into one batch
    assert bad is not None
    with pytest.raises(LedgerError, match="no_such_table"):
        bad.wait(10)
    gone.wait(10)
    other.wait(10)
    row = reader.machine(name)
    assert row is not None
    assert (row.state, row.gone) == ("deleted", 456.0)
    assert reader.machine("m-other") is not None


def test_runs_of_one_statement_commit_as_if_row_by_row(
    db: Db, ledgers: Callable[..., Ledger], reader: LedgerReader,
) -> None:
    """Writes queued while the lock is held commit in one batch, where runs of one statement become
    multi-row statements: every row ends up as one write at a time would leave it."""
    led = ledgers()
    names = [f"m-{i}" for i in range(1200)]  # more rows than one statement takes

    def held(queue: Callable[[], list[Any]]) -> None:
        with db.writes_held():
            pending = queue()
            time.sleep(0.2)  # the lock held a while on purpose: the writer gathers the writes into one batch
        for w in pending:
            w.wait(30)

    held(lambda: [led.queue_intent(name=n, cloud="sim", job=f"j/seed-{i}", seed=i, attempt=0, deadline=1.0)
                  for i, n in enumerate(names)]
                 + [led.queue_gone(n, float(i), "deleted") for i, n in enumerate(names) if i % 3 == 0])
    # the same machine twice in one run: the later write wins, as row by row
    held(lambda: [led.queue_gone("m-1", 7.0, "first"), led.queue_gone("m-1", 8.0, "second")])
    rows = {r[0]: r[1:] for r in db.raw("SELECT name, state, gone, reason, seed FROM machines")}
    assert len(rows) == 1200
    for i, n in enumerate(names):
        expected = ("deleted", float(i), "deleted", i) if i % 3 == 0 else ("alive", None, None, i)
        if n == "m-1":
            expected = ("deleted", 8.0, "second", 1)
        assert rows[n] == expected, n
    assert reader.machine("m-3") is not None


def test_a_run_that_could_differ_from_row_by_row_is_written_row_by_row() -> None:
    """Rows that a later row's WHERE finds only after an earlier row changed them: one UPDATE FROM
    would see the table as it was before the run, so such a run is not rewritten."""
    results = []
    for run in (_run_many, lambda c, sql, rows: c.executemany(sql, rows)):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.execute("CREATE TABLE m (name TEXT PRIMARY KEY, owner TEXT)")
        conn.executemany("INSERT INTO m VALUES (?, ?)", [("a", "x"), ("b", "y")])
        run(conn, "UPDATE m SET owner=? WHERE owner=?", [("y", "x"), ("z", "y")])  # x -> y, then y -> z
        results.append(conn.execute("SELECT name, owner FROM m ORDER BY name").fetchall())
        conn.close()
    assert results[0] == results[1] == [("a", "z"), ("b", "z")]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_interleaved_writes_to_several_tables_go_table_by_table_with_the_same_effect(
    engine: str, request: pytest.FixtureRequest,
) -> None:
    """A batch of writes to three tables, interleaved (as a thousand attempts queue them): taken
    table by table between function ops, as a few multi-row statements (SQLite) or pipelined runs
    (PostgreSQL), it leaves what one write after the other leaves; a function op still sees every
    write queued before it."""
    ops: list[Any] = []
    seen: list[int] = []
    for i in range(300):
        ops.append(("INSERT INTO events (t, body) VALUES (?,?)", (float(i), f"e{i}")))
        ops.append(("INSERT OR REPLACE INTO machines (name, state) VALUES (?,?)", (f"m{i % 50}", f"s{i}")))
        if i == 150:  # a function op: a barrier, after which it reads what came before
            ops.append(lambda c: seen.append(c.execute("SELECT count(*) FROM events").fetchone()[0]))
        ops.append(("UPDATE jobs SET state=? WHERE key=?", (f"u{i}", f"j{i}")))

    made: list[Any] = []

    def fresh() -> Any:
        if engine == "sqlite":
            conn: Any = sqlite3.connect(":memory:", isolation_level=None)
        else:  # a connection that takes the ledger's SQL, as the writer's does (ledger/db.py)
            import psycopg

            from actor_run.supervisors.ledger.db import PostgresBackend, _PgConn

            url = request.getfixturevalue("postgres").create_database()
            backend = PostgresBackend(url)
            conn = _PgConn(psycopg.connect(url, autocommit=True), backend)
        made.append(conn)
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, t REAL, body TEXT)")
        conn.execute("CREATE TABLE jobs (key TEXT PRIMARY KEY, state TEXT)")
        conn.execute("CREATE TABLE machines (name TEXT PRIMARY KEY, state TEXT)")
        conn.executemany("INSERT INTO jobs VALUES (?, '')", [(f"j{i}",) for i in range(300)])
        if engine != "sqlite":
            backend._load_tables(conn)  # the primary keys INSERT OR REPLACE becomes an upsert on
        return conn

    def state(conn: Any) -> list[list[Any]]:
        return [[tuple(r) for r in conn.execute(sql).fetchall()]
                for sql in ("SELECT t, body FROM events ORDER BY id", "SELECT name, state FROM machines ORDER BY name",
                            "SELECT key, state FROM jobs ORDER BY key")]

    try:
        one_by_one = fresh()
        for op in ops:
            _run(one_by_one, op)
        grouped, statements = fresh(), []
        if engine == "sqlite":
            grouped.set_trace_callback(statements.append)
        _run_all(grouped, ops)
        if engine == "sqlite":
            grouped.set_trace_callback(None)
            assert len(statements) <= 12, statements[:20]
        assert state(grouped) == state(one_by_one)
        assert seen == [151, 151]  # both ways, the function saw the 151 events queued before it
    finally:
        for conn in made:
            conn.close()


# --- migrations --------------------------------------------------------------------------------------


def test_every_migration_applies_once_when_controllers_open_a_ledger_together(path: str | Path, db: Db) -> None:
    """Four controllers open a new ledger at once: each step runs once (on PostgreSQL, one row per
    step in schema_version; a second run of a step's CREATE TABLE would have failed)."""
    from concurrent.futures import ThreadPoolExecutor

    from actor_run.supervisors.ledger.schema import current_version

    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda i: Ledger(path, f"o{i}"), range(4)))
    for led in made:
        led.close()
    if db.postgres:
        assert db.raw("SELECT version FROM schema_version ORDER BY version") == [
            (n,) for n in range(1, current_version() + 1)]
    else:
        assert db.raw("PRAGMA user_version") == [(current_version(),)]


def test_postgresql_statements_are_translated_from_the_sqlite_dialect() -> None:
    from actor_run.supervisors.ledger.db import _ddl, _translate

    tables = {"m": (["name"], ["name", "state", "phase", "gone"])}
    assert _translate("INSERT OR REPLACE INTO m (name, state) VALUES (?,?)", tables) == (
        "INSERT INTO m (name, state) VALUES (%s,%s) ON CONFLICT (name) DO UPDATE SET state=EXCLUDED.state,"
        " phase=DEFAULT, gone=DEFAULT")
    assert _translate("INSERT OR IGNORE INTO m (name) VALUES (?)", tables) == (
        "INSERT INTO m (name) VALUES (%s) ON CONFLICT DO NOTHING")
    assert _translate("UPDATE m SET state='a?%' WHERE name LIKE ?", tables) == (
        "UPDATE m SET state='a?%' WHERE name LIKE %s")  # nothing inside quotes changes
    assert _translate("SELECT 1 % 2", tables) == "SELECT 1 %% 2"
    assert _ddl("CREATE TABLE e (id INTEGER PRIMARY KEY, n INTEGER, t REAL, b BLOB)") == (
        "CREATE TABLE e (id BIGSERIAL PRIMARY KEY, n BIGINT, t DOUBLE PRECISION, b BYTEA)")


def test_a_postgresql_url_is_described_without_its_password() -> None:
    from actor_run.supervisors.ledger.db import describe

    assert describe("postgresql://team:s3cret@db.example/ledger") == "postgresql://team:***@db.example/ledger"
    assert "s3cret" not in describe("postgres://u:s3cret@h:5432/d?sslmode=require")


# --- owners across machines: leases and fencing tokens (PostgreSQL) --------------------------------


def _wait(check: Callable[[], bool], timeout: float = 20.0) -> None:
    poll(check, timeout, "the condition")


@pytest.fixture
def pg_url(postgres: Any) -> Iterator[str]:
    from actor_run.supervisors.ledger.db import close_pools

    yield postgres.create_database()
    close_pools()


def test_an_owner_whose_lease_expired_is_dead_for_everyone_and_is_never_renewed(pg_url: str) -> None:
    a, b = Ledger(pg_url, "a" * 32, lease_s=1.0), Ledger(pg_url, "b" * 32, lease_s=600.0)
    reader = LedgerReader(pg_url)
    try:
        a.register_owner()
        b.register_owner()
        assert {a.owner, b.owner} <= reader.live_owners()
        _wait(lambda: a.owner not in reader.live_owners())  # the database's clock passed a's lease
        assert b.owner in reader.live_owners()
        lease = [o.lease_until for o in reader.owners() if o.id == a.owner]
        assert a.beat_owner()  # the renewal is queued, and refused: an expired lease stays expired
        with pytest.raises(StaleClaim, match="lease expired"):
            a.flush()  # and from now on this controller writes nothing at all
        assert a.lease_lost
        assert [o.lease_until for o in reader.owners() if o.id == a.owner] == lease
        assert not a.beat_owner()
        assert a.owner not in reader.live_owners()
    finally:
        a.close()
        b.close()
        reader.close()


def test_every_commit_renews_a_lease_that_still_holds(pg_url: str) -> None:
    """The owner's beat is a write queued behind the others (thousands in a start burst): each
    transaction renews the lease itself first, while it holds. Three workers of 3,000 attempts each
    lost their 30 s leases to that queue (bench/RESULTS.md)."""
    import psycopg

    a = Ledger(pg_url, "c" * 32, lease_s=600.0)
    reader = LedgerReader(pg_url)
    try:
        a.register_owner()
        with psycopg.connect(pg_url, autocommit=True) as c:  # its beat not yet through: 5 s left
            c.execute("UPDATE owners SET lease_until = extract(epoch from clock_timestamp()) + 5 WHERE id = %s",
                      (a.owner,))
        short = next(o.lease_until for o in reader.owners() if o.id == a.owner)
        a.record_job(key="j/seed-1", name="j", seed=1, spec=b"{}", state="running", out_dir="/o")
        a.flush()  # a plain write, no beat
        renewed = next(o.lease_until for o in reader.owners() if o.id == a.owner)
        assert short is not None
        assert renewed is not None
        assert renewed > short + 500  # lease_s from that commit
        assert not a.lease_lost
    finally:
        a.close()
        reader.close()


def test_a_controller_whose_claim_was_taken_writes_nothing_more_for_that_job(pg_url: str) -> None:
    old, new = Ledger(pg_url, "o" * 32), Ledger(pg_url, "n" * 32)
    lost: list[set[str]] = []
    old.on_stale = lost.append
    try:
        old.register_owner()
        new.register_owner()
        old.record_job(key="j/seed-1", name="j", seed=1, spec=b"{}", state="running", out_dir="/o")
        old.record_job(key="k/seed-1", name="k", seed=1, spec=b"{}", state="running", out_dir="/o")
        old.record_intent(name="m-1", cloud="sim", job="j", seed=1, attempt=0, deadline=1.0)
        assert new.claim_job("j/seed-1", old.owner)  # as an adopter does once old's lease is gone
        assert not new.claim_job("j/seed-1", old.owner)  # once
        end = old.record_job_end(key="j/seed-1", state="succeeded", failure=None, detail="", attempts=1, usd=0)
        with pytest.raises(StaleClaim):
            end.wait(10)
        with pytest.raises(StaleClaim):
            old.record_gone("m-1", 2.0, "deleted")
        assert not old.still_holds("m-1")
        old.record_event(JobEnded(job="k", seed=1, attempt=0, outcome="succeeded", attempts=1))  # still its own
        old.flush()
        assert lost == [{"j/seed-1"}]
        reader = LedgerReader(pg_url)
        try:
            jobs = {j["key"]: j for j in reader.jobs()}
            assert (jobs["j/seed-1"]["owner"], jobs["j/seed-1"]["state"]) == (new.owner, "running")
            assert reader.machine("m-1").state == "alive"  # type: ignore[union-attr]  # the adopter's now
            assert [e["job"] for e in reader.events()] == ["k/seed-1"]
        finally:
            reader.close()
    finally:
        old.close()
        new.close()

def test_an_adopters_claim_goes_ahead_of_its_own_queued_writes(pg_url: str) -> None:
    """A worker in a start burst has thousands of its own writes queued; its claim of a dead
    worker's jobs goes into the next transaction ahead of them (none is about those jobs), not
    behind them: here the writes queued before it include one that cannot commit (its run's row is
    held), and the claim still commits."""
    import psycopg

    dead, me = Ledger(pg_url, "d" * 32), Ledger(pg_url, "m" * 32)
    held, blocker = psycopg.connect(pg_url, autocommit=True), psycopg.connect(pg_url, autocommit=True)
    try:
        dead.register_owner()
        me.register_owner()
        dead.run, me.run = "dead-run", "my-run"
        assert me.start_run("my-run", batch="b.toml", out_dir="/o")
        for seed in range(3):
            dead.record_job(key=f"d/seed-{seed}", name="d", seed=seed, spec=b"{}", state="running", out_dir="/o")
        me.record_job(key="mine/seed-1", name="mine", seed=1, spec=b"{}", state="running", out_dir="/o")
        dead.flush()
        me.flush()
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # the writer's transaction in hand waits
        held.execute("BEGIN")
        held.execute("SELECT id FROM runs WHERE id = 'my-run' FOR UPDATE")  # my job's end cannot commit
        me.record_event(JobEnded(job="mine", seed=1, outcome="succeeded", attempts=1))
        poll(lambda: blocker.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                     ).fetchone()[0] > 0, 30, "the writer waiting on the events table")  # type: ignore[index]
        for _ in range(1000):  # a burst's writes, queued behind it
            me.record_event(JobEnded(job="mine", seed=1, outcome="succeeded", attempts=1))
        end = me.record_job_end(key="mine/seed-1", state="succeeded", failure=None, detail="", attempts=1, usd=0.0)
        won: list[set[str]] = []
        queued = len(me._queue._items)  # the burst, waiting behind the writer's transaction in hand
        claiming = threading.Thread(target=lambda: won.append(
            me.claim_jobs([(f"d/seed-{seed}", dead.owner, "dead-run") for seed in range(3)])))
        claiming.start()
        # the claim is queued before the writer goes on (else the writer could take the burst, its job's
        # end among them, first: that transaction waits on `held` for good, the claim behind it)
        poll(lambda: len(me._queue._items) > queued, 30, "the claim queued")
        blocker.execute("ROLLBACK")
        claiming.join(60)
        assert won == [{"d/seed-0", "d/seed-1", "d/seed-2"}]  # committed while the job's end still waits
        assert not end.done.is_set()
        held.execute("ROLLBACK")
        end.wait(60)
    finally:
        for conn in (held, blocker):
            conn.close()
        dead.close()
        me.close()


def test_two_runs_of_one_job_keep_their_own_rows(ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    first, second = ledgers(), ledgers()
    for led, run in ((first, "run00001"), (second, "run00002")):
        led.run = run
        assert led.start_run(run, batch="b.toml", out_dir=f"/out/{run}")
        led.record_job(key="j/seed-1", name="j", seed=1, spec=b"{}", state="running", out_dir=f"/out/{run}/j/seed-1")
        for attempt in (0, 1):
            led.record_attempt(job="j/seed-1", attempt=attempt, machine="m", cloud="sim", region="r", state="failed",
                               failure="stalled", detail=run, started=1.0, ended=2.0, usd=0.25)
        led.record_event(JobEnded(job="j", seed=1, outcome="failed", attempts=2))
        led.record_job_end(key="j/seed-1", state="failed", failure="stalled", detail=run, attempts=2, usd=0.5).wait()
        led.end_run(run)
    # attempt 0 of the second run does not replace the first run's
    assert [(a["run"], a["attempt"], a["detail"]) for a in reader.attempts()] == [
        ("run00001", 0, "run00001"), ("run00001", 1, "run00001"), ("run00002", 0, "run00002"),
        ("run00002", 1, "run00002")]
    assert [(j["run"], j["detail"], j["out_dir"]) for j in reader.jobs()] == [
        ("run00001", "run00001", "/out/run00001/j/seed-1"), ("run00002", "run00002", "/out/run00002/j/seed-1")]
    assert [e["run"] for e in reader.events("j/seed-1")] == ["run00001", "run00002"]
    assert [len(reader.events(run=r)) for r in ("run00001", "run00002")] == [1, 1]
    runs = reader.runs()
    assert [(r.id, r.owner, r.state, r.jobs, r.failed, r.usd) for r in runs] == [
        ("run00001", first.owner, "ended", 1, 1, 0.5), ("run00002", second.owner, "ended", 1, 1, 0.5)]


def test_a_running_job_of_a_dead_owner_is_an_orphan(ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    a, b = ledgers(), ledgers()
    a.register_owner()
    b.register_owner()
    a.record_job(key="j/seed-1", name="j", seed=1, spec=b"{}", state="running", out_dir="/o")
    b.record_job(key="k/seed-1", name="k", seed=1, spec=b"{}", state="queued", out_dir="/o")
    a.flush()
    b.flush()
    assert not reader.has_orphans(me=b.owner)  # its owner lives; a queued job is nobody's yet
    a.close_owner()
    assert reader.has_orphans(me=b.owner)
    assert not reader.has_orphans(me=a.owner)  # one's own jobs are not orphans to oneself


def test_plan_resume_reads_the_dead_owners_jobs_each_with_its_own_machines(
        ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    """What an adopter plans from: only the running jobs of dead owners (not a live one's, not a
    finished or queued one, not its own), each with the machines of its own name, seed and run
    (a row of no run counts: an older ledger's): the attempt to go on from, and the one to reattach."""
    import msgspec

    from actor_run.protocols.specs import Job
    from actor_run.supervisors.ledger.resume import plan_resume

    dead, live, me = ledgers(), ledgers(), ledgers()
    for led in (dead, live, me):
        led.register_owner()
    spec = {s: msgspec.json.encode(Job(name="j", command="true", seed=s)) for s in range(1, 6)}
    dead.run, live.run = "run1", "run2"
    for seed, state in ((1, "running"), (2, "running"), (3, "succeeded"), (4, "queued")):
        dead.record_job(key=f"j/seed-{seed}", name="j", seed=seed, spec=spec[seed], state=state, out_dir=f"/o/{seed}")
    live.record_job(key="j/seed-5", name="j", seed=5, spec=spec[5], state="running", out_dir="/o/5")
    live.record_job(key="j/seed-1", name="j", seed=1, spec=spec[1], state="running", out_dir="/o/r2")  # run2's
    # seed 1: attempt 0 gone, attempt 1 runs on its machine; seed 2: attempt 0 asked for, never answered
    dead.record_intent(name="m-1-0", cloud="sim", job="j", seed=1, attempt=0, deadline=time.time() + 600)
    dead.record_gone("m-1-0", time.time(), "deleted")
    dead.record_intent(name="m-1-1", cloud="sim", job="j", seed=1, attempt=1, deadline=time.time() + 600)
    dead.record_launched(Machine(cloud="sim", id="m-1-1", name="m-1-1"))
    dead.record_started("m-1-1", "/w/1", 4242, time.time())
    dead.record_intent(name="m-2-0", cloud="sim", job="j", seed=2, attempt=0, deadline=time.time() + 600)
    live.record_intent(name="m-1-r2", cloud="sim", job="j", seed=1, attempt=7, deadline=time.time() + 600)  # run2's
    for led in (dead, live):
        led.flush()
    assert plan_resume(reader, me=me.owner) == []  # every owner alive
    dead.close_owner()
    items = plan_resume(reader, me=me.owner)
    assert [(i.run, i.job.key, i.from_owner, i.seed_dir, i.first_attempt) for i in items] == [
        ("run1", "j/seed-1", dead.owner, "/o/1", 1), ("run1", "j/seed-2", dead.owner, "/o/2", 1)]
    assert items[0].reattach is not None
    assert (items[0].reattach.machine.name, items[0].reattach.pid) == ("m-1-1", 4242)
    assert items[1].reattach is None
    assert [j["key"] for j in reader.orphaned_jobs(me=me.owner, run="run2")] == []
    assert [j["key"] for j in reader.orphaned_jobs(me=dead.owner)] == []  # one's own are not orphans to oneself


def test_adopters_claiming_a_dead_owners_jobs_at_once_each_win_different_ones(
        ledgers: Callable[..., Ledger], reader: LedgerReader, db: Db) -> None:
    """`claim_jobs`, one transaction (one statement on PostgreSQL) for a dead worker's many jobs:
    two adopters asking for the same ones at the same moment win each job once between them; a job
    that moved on (another owner, or ended) is won by nobody; the winner holds it (its token)."""
    import threading

    dead, a, b = ledgers(), ledgers(), ledgers()
    dead.run = "r"
    keys = [f"j/seed-{i}" for i in range(300)]
    for i, key in enumerate(keys):
        dead.record_job(key=key, name="j", seed=i, spec=b"{}", state="running", out_dir="/o")
    dead.record_job(key="k/seed-1", name="k", seed=1, spec=b"{}", state="succeeded", out_dir="/o")
    dead.flush()
    wanted = [(key, dead.owner, "r") for key in keys] + [("k/seed-1", dead.owner, "r"), ("x/seed-1", "nobody", "r")]
    won: dict[str, set[str]] = {}
    go = threading.Barrier(2)

    def claim(led: Ledger) -> None:
        go.wait(30)
        won[led.owner] = led.claim_jobs(list(wanted))

    threads = [threading.Thread(target=claim, args=(led,)) for led in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not won[a.owner] & won[b.owner]
    assert won[a.owner] | won[b.owner] == set(keys)
    owners = {j["key"]: j["owner"] for j in reader.jobs()}
    for led in (a, b):
        assert all(owners[k] == led.owner for k in won[led.owner])
        tokens = dict(db.raw("SELECT key, token FROM jobs WHERE owner=?", (led.owner,)))
        assert tokens == {k: led.tokens[k] for k in won[led.owner]}
    assert owners["k/seed-1"] == dead.owner
    assert a.claim_jobs([(key, dead.owner, "r") for key in keys]) == set()  # no longer the dead owner's


def test_a_dead_controllers_preempted_machine_is_settled_up_to_its_preemption(
    ledgers: Callable[..., Ledger], reader: LedgerReader
) -> None:
    """Killed after its machine was deleted and before the attempt's charge: the settle charges
    what the provider billed, up to the preemption the attempt had heard of, not to the delete."""
    from actor_run.protocols.messages import Offer
    from actor_run.supervisors.tree.reservations import settle_reservations

    dead, alive = ledgers("dead"), ledgers()
    t0 = time.time() - 100
    offer = Offer(cloud="sim", region="us-east", gpu="A100", hourly_usd=360.0, candidate=0)
    for name, attempt, taken in (("m0", 0, t0 + 10.0), ("m1", 1, None)):
        dead.record_reserved(job="t/seed-1", attempt=attempt, offer=offer, hold_s=60.0, usd=6.0, seq=attempt,
                             limit_usd=None)
        dead.record_intent(name=name, cloud="sim", job="t", seed=1, attempt=attempt, deadline=t0 + 1000,
                           offer=offer)
        dead.record_launched(Machine(cloud="sim", id=name, name=name, hourly_usd=360.0, created_at=t0,
                                     deadline=t0 + 1000))
        if taken is not None:
            dead.record_taken(name, taken)
        dead.record_gone(name, t0 + 12.0, "deleted")
    assert settle_reservations(reader, alive, keep_owner=alive.owner) == 2
    charged = {r["attempt"]: (r["charged"], r["seconds"]) for r in reader.reservations()}
    assert charged[0] == pytest.approx((1.0, 10.0))  # $360/h for the 10 s until the preemption
    assert charged[1] == pytest.approx((1.2, 12.0))  # not preempted: until the delete


def test_recording_jobs_draws_no_randomness_per_job_and_every_token_differs(
        ledgers: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch) -> None:
    """A fencing token per job, each unique, without a draw from the system's random source per job
    (uuid4 each: a third of the time submitting 3,000 jobs, each draw a wait for the GIL)."""
    a, b = ledgers(), ledgers()

    def no_urandom(n: int) -> bytes:
        raise AssertionError("a draw from os.urandom per job")

    monkeypatch.setattr(os, "urandom", no_urandom)
    for i in range(200):
        a.record_job(key=f"j/seed-{i}", name="j", seed=i, spec=b"{}", state="running", out_dir="/o")
        b.record_job(key=f"k/seed-{i}", name="k", seed=i, spec=b"{}", state="running", out_dir="/o")
    monkeypatch.undo()
    tokens = [*a.tokens.values(), *b.tokens.values()]
    assert len(tokens) == len(set(tokens)) == 400
    a.flush()
    b.flush()


def test_a_workers_poll_reads_states_and_a_count_not_every_jobs_spec(
        ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    """What `actor-run worker` asks every poll: each job's state (of one run, or of all), and how many
    are still queued or running; never the specs (megabytes at 9,000 jobs, every poll, per worker)."""
    a = ledgers()
    a.run = "r1"
    for i, state in enumerate(("queued", "running", "succeeded", "failed")):
        a.record_job(key=f"j/seed-{i}", name="j", seed=i, spec=b"{" + b" " * 10_000 + b"}", state=state,
                     out_dir="/o")
    a.flush()
    assert reader.job_states("r1") == {"j/seed-0": "queued", "j/seed-1": "running", "j/seed-2": "succeeded",
                                       "j/seed-3": "failed"}
    assert reader.job_states() == {f"r1/j/seed-{i}": s for i, s in
                                   enumerate(("queued", "running", "succeeded", "failed"))}
    assert reader.unfinished_jobs() == 2


def test_jobs_a_worker_put_back_are_queued_again_and_left_out_of_its_count_of_unfinished(
        ledgers: Callable[..., Ledger], reader: LedgerReader) -> None:
    """A worker claims jobs it cannot run (no cloud of theirs usable there) and puts them back: they
    are queued again, at the queue's end, and `--until-idle` leaves them out of what it waits for,
    also past a statement's bound on parameters (asked in parts of a thousand)."""
    submitter, worker = ledgers(), ledgers()
    for led in (submitter, worker):
        led.register_owner()
    submitter.run = "r1"
    for seed in range(2_500):
        submitter.record_job(key=f"j/seed-{seed}", name="j", seed=seed, spec=b"{}", state="queued", out_dir="o")
    submitter.flush()
    first = worker.claim_queued(3)
    worker.put_back([(c.run, c.key) for c in first[:2]])
    states = reader.job_states("r1")
    assert [states[c.key] for c in first] == ["queued", "queued", "running"]
    assert worker.claim_queued(1)[0].key not in {c.key for c in first}  # the put back went to the queue's end
    put = {("r1", f"j/seed-{seed}") for seed in range(2_400)}
    states = reader.job_states("r1")
    assert reader.unfinished_jobs() == 2_500
    assert reader.unfinished_jobs(but_queued=put) == 2_500 - len({k for k in put if states[k[1]] == "queued"})
    assert reader.unfinished_jobs(but_queued=put) == 102  # the two claimed jobs running, and the 100 not put
    assert reader.unfinished_jobs(but_queued={("r2", "j/seed-5")}) == 2_500  # another run's key: not these


def test_cancel_ends_a_queued_job_only_while_nobody_claimed_it(ledgers: Callable[..., Ledger], path: str | Path,
                                                                 reader: LedgerReader) -> None:
    """`actor-run cancel` read two jobs queued; a worker claimed one before the cancel's write: that
    one is the worker's to cancel (through a request), the other ends here."""
    submitter, worker = ledgers(), ledgers()
    for led in (submitter, worker):
        led.register_owner()
    submitter.run = "r1"
    for seed in (1, 2):
        submitter.record_job(key=f"j/seed-{seed}", name="j", seed=seed, spec=b"{}", state="queued", out_dir="o")
    submitter.flush()
    read = {j["key"]: j for j in reader.jobs()}
    [claimed] = worker.claim_queued(1)
    ended = end_unowned(path, [(j["run"], j["key"], j["name"], j["seed"], j["state"], j["owner"])
                               for j in read.values()], "canceled with actor-run cancel")
    left = ({"j/seed-1", "j/seed-2"} - {claimed.key}).pop()
    assert ended == {("r1", left)}
    now = {j["key"]: (j["state"], j["failure"], j["owner"]) for j in reader.jobs()}
    assert now == {claimed.key: ("running", None, worker.owner), left: ("failed", "canceled", submitter.owner)}
