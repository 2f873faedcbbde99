"""supervisors/ledger/schema.py: a ledger file written by the landed version (its SCHEMA, kept verbatim
from commit 2e5f0be in data/ledger_schema_2e5f0be.sql) opens in this one without losing a row."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import msgspec
import pytest

from actor_run.protocols.messages import Leased, Machine, encode
from actor_run.protocols.specs import Job
from actor_run.supervisors.ledger import Ledger, LedgerError, LedgerReader
from actor_run.supervisors.ledger.resume import plan_resume
from actor_run.supervisors.ledger.schema import MIGRATIONS, Migration, SchemaError, current_version, migrate, version_of

OLD_SCHEMA = (Path(__file__).parent.parent / "data" / "ledger_schema_2e5f0be.sql").read_text()
A, B = "a" * 8 + "1" * 24, "b" * 8 + "2" * 24  # two controllers that wrote the old ledger


def old_ledger(path: Path, *, schema: str = OLD_SCHEMA) -> dict[str, list[tuple[object, ...]]]:
    """A ledger as the landed version left it: A ran a batch of two seeds to the end, B's one job
    was still running when B died; the rows each table held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(schema)
    now = time.time()
    spec = msgspec.json.encode(Job(name="old", command="true", seed=3))
    m3 = msgspec.json.encode(Machine(cloud="sim", id="id3", name="ar-old-3-a0-bbbbbbbb-d2")).decode()
    rows: dict[str, list[tuple[object, ...]]] = {
        "owners": [(A, 11, now - 100, "h", now - 50, 1), (B, 12, now - 9000, "h", now - 4000, 0)],
        "jobs": [
            ("old/seed-1", "old", 1, A, spec, "succeeded", None, "", 1, 0.5, "/res/a/old/seed-1", now - 60),
            ("old/seed-2", "old", 2, A, spec, "failed", "job_failed", "exit 1", 2, 0.25, "/res/a/old/seed-2", now - 55),
            ("old/seed-3", "old", 3, B, spec, "running", None, None, 0, 0.0, "/res/b/old/seed-3", now - 45),
        ],
        "attempts": [
            ("old/seed-1", 0, A, "m1", "sim", "us", "succeeded", None, "", now - 80, now - 60, 0.5),
            ("old/seed-2", 0, A, "m2", "sim", "us", "failed", "stalled", "", now - 80, now - 70, 0.1),
            ("old/seed-2", 1, A, "m3", "sim", "us", "failed", "job_failed", "exit 1", now - 70, now - 55, 0.15),
        ],
        "machines": [
            ("ar-old-1-a0-aaaaaaaa-d1", "sim", A, "old", 1, 0, now + 60, "deleted", "deleted", "id1", "us", 1.0,
             now - 80, now - 60, "deleted", None, "/w1", 5, now - 79, 0, "{}", None),
            ("ar-old-3-a0-bbbbbbbb-d2", "sim", B, "old", 3, 0, now + 60, "alive", "running", "id3", "us", 1.0,
             now - 50, None, None, None, "/w3", 7, now - 49, 0, m3, None),
        ],
        "clouds": [("sim", "{}")],
        "events": [
            (1, now - 79, A, "old/seed-1", 1, 0, "Leased",
             encode(Leased(job="old", seed=1, machine=Machine(cloud="sim", id="id1", name="m1"))).decode()),
            (2, now - 49, B, "old/seed-3", 3, 0, "Leased",
             encode(Leased(job="old", seed=3, machine=Machine(cloud="sim", id="id3", name="m3"))).decode()),
        ],
    }
    for table, values in rows.items():
        if table == "machines" and "resumable" not in schema:
            values = [v[:-3] for v in values]
        marks = ",".join("?" * len(values[0]))
        conn.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    conn.commit()
    conn.close()
    return rows


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [*conn.iterdump(), f"version {version_of(conn)}"]
    finally:
        conn.close()


def test_a_ledger_of_the_landed_version_opens_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    rows = old_ledger(path)
    reader = LedgerReader(path)
    try:
        with reader.backend.reading() as conn:
            assert version_of(conn) == current_version() == MIGRATIONS[-1].version
        runs = {r.id: r for r in reader.runs()}
        # one run per owner of the old jobs, its results where its jobs' seed folders are
        assert set(runs) == {A[:8], B[:8]}
        a, b = runs[A[:8]], runs[B[:8]]
        assert (a.owner, a.out_dir, a.jobs, a.succeeded, a.failed, a.unfinished, a.usd, a.state) == (
            A, "/res/a", 2, 1, 1, 0, 0.75, "ended")
        assert (b.owner, b.out_dir, b.jobs, b.unfinished, b.state) == (B, "/res/b", 1, 1, "running")
        jobs = reader.jobs()
        assert [(j["run"], j["key"], j["owner"], j["state"], j["failure"], j["attempts"], j["usd"], j["out_dir"],
                 j["spec"]) for j in jobs] == [
            (r[3][:8], r[0], r[3], r[5], r[6], r[8], r[9], r[10], r[4]) for r in rows["jobs"]]  # type: ignore[index]
        assert [(t["run"], t["job"], t["attempt"], t["machine"], t["state"], t["failure"], t["usd"])
                for t in reader.attempts()] == [
            (A[:8], r[0], r[1], r[3], r[6], r[7], r[11]) for r in rows["attempts"]]
        assert [(e["run"], e["id"], e["job"], e["type"], e["body"]) for e in reader.events()] == [
            (str(r[2])[:8], r[0], r[3], r[6], r[7]) for r in rows["events"]]
        assert [(m.name, m.run, m.owner, m.state, m.work, m.pid) for m in reader.machines()] == [
            (r[0], str(r[2])[:8], r[2], r[7], r[16], r[17]) for r in rows["machines"]]
        assert reader.clouds() == [("sim", {})]
        assert [(o.id, o.closed) for o in reader.owners()] == [(A, 1), (B, 0)]
        # what resume takes from it: B's job, with the folder B's run recorded
        items = plan_resume(reader, me="c" * 32)
        assert [(i.run, i.job.key, i.seed_dir, i.first_attempt) for i in items] == [
            (B[:8], "old/seed-3", "/res/b/old/seed-3", 0)]
        assert items[0].reattach is not None
        assert (items[0].reattach.machine.name, items[0].reattach.work) == ("ar-old-3-a0-bbbbbbbb-d2", "/w3")
    finally:
        reader.close()
    # opened again: nothing to do, nothing changed
    before = dump(path)
    LedgerReader(path).close()
    assert dump(path) == before


def test_a_ledger_older_still_gains_the_columns_added_later(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    schema = OLD_SCHEMA.replace(", resumable INTEGER DEFAULT 0,\n  machine TEXT, offer TEXT", "")
    assert "resumable" not in schema
    old_ledger(path, schema=schema)
    reader = LedgerReader(path)
    try:
        assert [(m.name, m.resumable, m.machine, m.run) for m in reader.machines()][1] == (
            "ar-old-3-a0-bbbbbbbb-d2", 0, None, B[:8])
    finally:
        reader.close()


def test_a_migrated_ledger_takes_new_runs(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    old_ledger(path)
    led = Ledger(path, "d" * 32, run="newrun01")
    try:
        assert led.start_run("newrun01", batch="b.toml", out_dir="/res/new")
        assert not led.start_run("newrun01", batch="b.toml", out_dir="/res/new")  # ids are unique
        led.record_job(key="old/seed-1", name="old", seed=1, spec=b"{}", state="running", out_dir="/res/new/old/seed-1")
        led.flush()
    finally:
        led.close()
    reader = LedgerReader(path)
    try:
        # the same job key in two runs: two rows, neither replaces the other
        assert sorted((j["run"], j["state"]) for j in reader.jobs() if j["key"] == "old/seed-1") == [
            (A[:8], "succeeded"), ("newrun01", "running")]
    finally:
        reader.close()


def test_a_ledger_from_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {current_version() + 1}")
    conn.execute("CREATE TABLE future (x)")
    conn.commit()
    conn.close()
    before = dump(path)
    with pytest.raises(LedgerError, match="newer actor-run"):
        LedgerReader(path)
    assert dump(path) == before


def test_steps_apply_in_order_once_and_a_failed_step_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.sqlite", isolation_level=None)
    applied: list[int] = []

    def step(n: int) -> Migration:
        return Migration(version=n, name=f"t{n}", statements=(f"CREATE TABLE t{n} (x)",),
                         apply=lambda c: applied.append(n))

    assert migrate(conn, [step(1), step(2)]) == 0
    assert migrate(conn, [step(1), step(2), step(3)]) == 2
    assert applied == [1, 2, 3]
    bad = Migration(version=4, name="bad", statements=("CREATE TABLE t4 (x)", "INSERT INTO nowhere VALUES (1)"))
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, [step(1), step(2), step(3), bad])
    assert version_of(conn) == 3
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name='t4'").fetchone() == (0,)
    with pytest.raises(SchemaError, match="numbered"):
        migrate(conn, [step(1), step(3)])
    conn.close()
