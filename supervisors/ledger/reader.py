"""The ledger's read side: `LedgerReader` and the rows it returns (machines, runs; owners are
machines.py's)."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.messages import Event, decode_event, waiting_words
from actor_run.supervisors.ledger.db import open_backend
from actor_run.supervisors.ledger.owners import OwnerRow, owner_is_alive

HOURS_PER_MONTH = 730.0  # 365 x 24 / 12: how providers turn a monthly storage price into an hourly one


class CacheRow(msgspec.Struct, frozen=True, kw_only=True):
    cloud: str
    region: str
    name: str
    volume_id: str = ""
    size_gb: int = 0
    state: str = "requested"  # requested -> alive -> deleted
    created: float = 0.0
    deleted: float | None = None
    usd_per_gb_month: float = 0.0
    owner: str = ""

    def usd(self, now: float | None = None) -> float:
        """What its storage has cost so far (size x price x the hours it has existed)."""
        end = self.deleted if self.deleted is not None else (now if now is not None else time.time())
        hours = max(0.0, end - self.created) / 3600.0
        return self.size_gb * self.usd_per_gb_month / HOURS_PER_MONTH * hours


def cache_rows(rows: list[dict[str, Any]]) -> list[CacheRow]:
    return [msgspec.convert(r, CacheRow) for r in rows]


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

    def __init__(self, path: str | Path, *, read_only: bool = False, missing_ok: bool = False) -> None:
        """`read_only`: a reading command's reader, which makes no folder or file and raises
        LedgerUnusable for a path that is no ledger (db.py's SqliteBackend); `missing_ok`: no file
        yet reads as an empty ledger (the default ledger before the first run)."""
        self.backend = open_backend(path, read_only=read_only, missing_ok=missing_ok)
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

    def machines(self, *, alive_only: bool = False, jobs: Iterable[tuple[str, int]] | None = None) -> list[MachineRow]:
        """Every machine, oldest first (or only the alive ones); with `jobs` ((name, seed) pairs), at
        least those of these jobs (on a shared ledger only they and a few more are read: a worker
        adopting 3,000 jobs of a 9,000-job batch reads their machines, not the batch's)."""
        where = ["state='alive'"] if alive_only else []
        args: tuple[Any, ...] = ()
        if jobs is not None and self.backend.fenced:
            names, seeds = set(), set()
            for name, seed in jobs:
                names.add(name)
                seeds.add(seed)
            where.append("job = ANY(?) AND seed = ANY(?)")
            args = (sorted(names), sorted(seeds))
        sql = "SELECT * FROM machines" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created"
        return [msgspec.convert(r, MachineRow) for r in self._rows(sql, args)]

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

    def has_orphans(self, *, me: str, run: str | None = None) -> bool:
        """Whether some running job (of `run`, or of any run) has a dead owner (a resume would take
        it): one small query on a shared ledger, where a worker asks it every poll before it plans an
        adoption."""
        of_run, args = (" AND j.run = ?", (me, run)) if run is not None else ("", (me,))
        if self.backend.fenced:
            rows = self._rows(
                f"SELECT 1 AS x FROM jobs j WHERE j.state='running' AND j.owner <> ?{of_run} AND NOT EXISTS (SELECT 1"
                " FROM owners o WHERE o.id = j.owner AND o.closed = 0 AND (o.lease_until IS NULL OR o.lease_until >"
                f" {self.backend.now_sql})) LIMIT 1", args)
            return any(True for _ in rows)
        live = self.live_owners() | {me}
        return any(r["owner"] not in live for r in self._rows(
            f"SELECT DISTINCT j.owner AS owner FROM jobs j WHERE j.state='running' AND j.owner <> ?{of_run}", args))

    def orphaned_jobs(self, *, me: str, run: str | None = None) -> list[dict[str, Any]]:
        """The running jobs (with their specs) of dead owners, of `run` or of every run, oldest run
        first: what a resume takes. On a shared ledger the database picks them (the lease by its
        clock, as `has_orphans` does), so an adopter reads the dead worker's jobs, not every job."""
        cols = "run, key, name, seed, owner, state, failure, detail, attempts, usd, out_dir, updated, spec"
        where, args = "state='running' AND owner <> ?", [me]
        if run is not None:
            where += " AND run=?"
            args.append(run)
        if self.backend.fenced:
            rows = self._rows(
                f"SELECT {cols} FROM jobs j WHERE {where} AND NOT EXISTS (SELECT 1 FROM owners o WHERE o.id = j.owner"
                f" AND o.closed = 0 AND (o.lease_until IS NULL OR o.lease_until > {self.backend.now_sql}))"
                " ORDER BY run, name, seed", tuple(args))
            return list(rows)
        live = self.live_owners() | {me}
        return [r for r in self._rows(f"SELECT {cols} FROM jobs WHERE {where} ORDER BY run, name, seed", tuple(args))
                if r["owner"] not in live]

    def job_states(self, run: str | None = None) -> dict[str, str]:
        """Job key -> state, of `run`, or (keyed run/key) of every run: what a worker asks every poll,
        so only those two columns (every job's spec each poll was megabytes at 9,000 jobs)."""
        if run is not None:
            return {r["key"]: r["state"] for r in self._rows("SELECT key, state FROM jobs WHERE run=?", (run,))}
        return {f"{r['run']}/{r['key']}": r["state"] for r in self._rows("SELECT run, key, state FROM jobs")}

    def unfinished_jobs(self, *, but_queued: Collection[tuple[str, str]] = ()) -> int:
        """How many jobs of any run are queued or running, but those (run, key) of `but_queued` that
        are queued (a worker's that it cannot run: they wait for another)."""
        rows = self._rows("SELECT count(*) AS n FROM jobs WHERE state IN ('queued', 'running')")
        n = int(next(rows)["n"])
        keys = sorted({key for _, key in but_queued})
        for at in range(0, len(keys), 1000):  # a statement's parameters are bounded (PostgreSQL: 65,535)
            part = keys[at:at + 1000]
            marks = ", ".join("?" for _ in part)
            found = self._rows(f"SELECT run, key FROM jobs WHERE state='queued' AND key IN ({marks})", tuple(part))
            n -= sum((r["run"], r["key"]) in but_queued for r in found)
        return n

    def jobs(self, run: str | None = None, *, spec: bool = True) -> list[dict[str, Any]]:
        """Jobs of every run, or of `run` (without `spec`: not their specs, which a follower need not read)."""
        cols = "run, key, name, seed, owner, state, failure, detail, attempts, usd, out_dir, updated"
        cols += ", spec" if spec else ""
        if run is None:
            return list(self._rows(f"SELECT {cols} FROM jobs ORDER BY run, name, seed"))
        return list(self._rows(f"SELECT {cols} FROM jobs WHERE run=? ORDER BY name, seed", (run,)))

    def caches(self, *, alive_only: bool = False) -> list[CacheRow]:
        """The cache volumes this ledger knows (caches.py), oldest first."""
        where = " WHERE state != 'deleted'" if alive_only else ""
        return cache_rows(list(self._rows(f"SELECT * FROM caches{where} ORDER BY created, cloud, region, name")))

    def job_clouds(self, run: str | None, key: str) -> dict[str, dict[str, Any]] | None:
        """The `[clouds.*]` tables job `key` of `run` was submitted with (its spec, secrets left out):
        the settings its machines were made with. None when the ledger holds no such job or spec."""
        if run is None:
            return None
        for r in self._rows("SELECT spec FROM jobs WHERE run=? AND key=?", (run, key)):
            try:
                spec = msgspec.json.decode(r["spec"]) if r["spec"] else None
            except msgspec.DecodeError:
                return None
            clouds = spec.get("clouds") if isinstance(spec, dict) else None
            return clouds if isinstance(clouds, dict) else {}
        return None

    def reservations(self, run: str | None = None) -> list[dict[str, Any]]:
        """Reservations (budget.py) of every run, or of `run`, in the order they were made."""
        if run is None:
            return list(self._rows("SELECT * FROM reservations ORDER BY reserved_at, run, job, attempt"))
        return list(self._rows("SELECT * FROM reservations WHERE run=? ORDER BY reserved_at, job, attempt", (run,)))

    def attempts(self, run: str | None = None) -> list[dict[str, Any]]:
        if run is None:
            return list(self._rows("SELECT * FROM attempts ORDER BY run, job, attempt"))
        return list(self._rows("SELECT * FROM attempts WHERE run=? ORDER BY job, attempt", (run,)))

    def events(self, job: str | None = None, run: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """The events recorded (of `job`, of `run`, of one `kind`: its type), oldest first."""
        where, args = [], []
        for column, value in (("job", job), ("run", run), ("type", kind)):
            if value is not None:
                where.append(f"{column}=?")
                args.append(value)
        sql = "SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return list(self._rows(sql, tuple(args)))

    def new_events(self, run: str, after: int, *, not_by: str | None = None) -> list[dict[str, Any]]:
        """`run`'s events recorded after the event id `after` (id, job, type, body), oldest first:
        what a reader that follows a run (the dashboard) reads each time, instead of them all.
        `not_by`: leave out those the owner of that id recorded (what a controller showed itself)."""
        if not_by is not None:
            return list(self._rows("SELECT id, job, type, body FROM events WHERE run=? AND id > ? AND owner <> ?"
                                   " ORDER BY id", (run, after, not_by)))
        return list(self._rows("SELECT id, job, type, body FROM events WHERE run=? AND id > ? ORDER BY id",
                               (run, after)))

    def run_budgets(self) -> dict[str, float]:
        """Each run's `budget_usd` (its jobs' policy), for the runs that have one."""
        sql = ("SELECT j.run, j.spec FROM jobs j JOIN (SELECT run, min(key) AS k FROM jobs GROUP BY run) f"
               " ON j.run = f.run AND j.key = f.k")
        out: dict[str, float] = {}
        for row in self._rows(sql):
            try:
                usd = json.loads(bytes(row["spec"])).get("policy", {}).get("budget_usd")
            except (ValueError, AttributeError):
                continue
            if isinstance(usd, int | float):
                out[row["run"]] = float(usd)
        return out

    def stages(self, run: str) -> dict[str, str]:
        """What each job of `run` waits on now, from its newest events: `booting`, `waiting for
        ssh`, `waiting for capacity` or `waiting for team budget 'NAME'` (a job missing here is doing
        something else)."""
        out: dict[str, str] = {}
        sql = ("SELECT job, type, body FROM events WHERE run=? AND type IN ('LeaseStage', 'WaitingForCapacity', "
               "'AttemptStarted', 'Leased', 'LeaseFailed', 'AttemptEnded', 'JobEnded') ORDER BY id")
        for row in self._rows(sql, (run,)):
            if row["type"] == "LeaseStage":
                out[row["job"]] = str(json.loads(row["body"]).get("stage", ""))
            elif row["type"] == "WaitingForCapacity":
                out[row["job"]] = waiting_words(json.loads(row["body"]))
            else:
                out.pop(row["job"], None)
        return out

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
            " coalesce(sum(CASE WHEN j.state='failed' AND coalesce(j.failure, '') <> 'canceled' THEN 1 ELSE 0 END), 0)"
            " AS failed,"
            " coalesce(sum(CASE WHEN j.state='failed' AND j.failure = 'canceled' THEN 1 ELSE 0 END), 0) AS canceled,"
            " coalesce(sum(CASE WHEN j.state IN ('running', 'queued') THEN 1 ELSE 0 END), 0) AS unfinished,"
            " coalesce(sum(CASE WHEN j.state='queued' THEN 1 ELSE 0 END), 0) AS queued,"
            # what `cost` adds up: the charges of its released reservations (jobs' own figures only for
            # a run that has none: a ledger written before reservations were)
            f" {held} AS held, coalesce((SELECT sum(m.charged) FROM reservations m WHERE m.run = r.id"
            "  AND m.state = 'released'), sum(j.usd), 0.0) AS usd"
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


# attempts that cost no attempt (max_attempts): walk steps (a place without stock, an account out of
# quota: no machine made) and a create the provider failed to answer (its transient fault, not the
# job's; whatever it made was found by name and deleted; the thrashing rule still bounds them)
UNCOUNTED = ("no_capacity", "quota", "ambiguous_create")


class JobMoney(msgspec.Struct, frozen=True, kw_only=True):
    """A job's money and attempts as `cost` reckons them (from its reservations): what its released
    ones were charged, and which attempts it used (walk steps left out)."""

    charged_usd: float = 0.0
    attempts: frozenset[int] = frozenset()


def money_by_job(reservations: Iterable[dict[str, Any]], attempts: Iterable[dict[str, Any]] = ()
                 ) -> dict[str, JobMoney]:
    """Each job's charges and attempts, from the same reservation rows `actor-run cost` adds up (a
    sweep's charge of a dead controller's machine included), with the attempt rows' numbers too;
    one figure for status, runs, cost and report."""
    charged: dict[str, float] = {}
    used: dict[str, set[int]] = {}
    for r in reservations:
        if r["state"] == "released":
            charged[r["job"]] = charged.get(r["job"], 0.0) + (r["charged"] or 0.0)
        if r.get("failure") not in UNCOUNTED:
            used.setdefault(r["job"], set()).add(int(r["attempt"]))
    for a in attempts:
        if a.get("failure") not in UNCOUNTED:
            used.setdefault(a["job"], set()).add(int(a["attempt"]))
    return {job: JobMoney(charged_usd=charged.get(job, 0.0), attempts=frozenset(used.get(job, ())))
            for job in charged.keys() | used.keys()}


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
    canceled: int = 0  # ended `canceled` (not counted in `failed`)
    held: int = 0  # running under a live owner's lease (a shared ledger)
