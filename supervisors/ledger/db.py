"""Where the ledger lives and how it speaks to it: SQLite (a file, the default) or PostgreSQL (a URL).

The ledger's SQL is written once, in SQLite's dialect. `PostgresBackend.sql` translates a
statement the first time it is seen (and caches it): `?` becomes `%s`, `INSERT OR IGNORE` an
`ON CONFLICT DO NOTHING`, `INSERT OR REPLACE` an upsert on the table's primary key that sets every
other column (those the statement names from it, the rest to their default: what SQLite's delete
and insert leaves), and the types of a `CREATE TABLE` or `ADD COLUMN` their PostgreSQL names.
Everything else is the SQL both engines share.

Schema changes are schema.py's numbered migrations, applied in order to either engine when a
connection opens (under SQLite's write lock; under a PostgreSQL advisory lock), so two controllers
opening one ledger at once apply each step once.

A PostgreSQL URL may hold a password: `describe()` is what goes into logs and messages, never the
URL itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from actor_run.protocols.failures import ActorRunError, SpecError
from actor_run.protocols.redact import add_url_password
from actor_run.supervisors.ledger.schema import SchemaError, current_version, migrate, version_of

ENV = "ACTOR_RUN_LEDGER"  # a ledger's path or URL, when --ledger does not name one
READ_WAIT_S = 5.0  # how long a read waits for a connection to a PostgreSQL ledger


class LedgerError(ActorRunError):
    """The ledger could not record something (the disk, a lock held too long, the server gone)."""


class LedgerUnusable(LedgerError):
    """The ledger named is no ledger this actor-run can use (a folder, not SQLite, damaged, written
    by a newer actor-run): the user's input is wrong (exit 2)."""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    @property
    def description(self) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Conn(Protocol):
    """What the ledger's ops use of a connection (a sqlite3.Connection is one as it is)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


def is_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def resolve(ledger: str | Path | None, state_dir: Path) -> str | Path:
    """The ledger a command or a Runner uses: the one named, else $ACTOR_RUN_LEDGER, else the
    SQLite file in the state folder."""
    named = ledger if ledger not in (None, "") else os.environ.get(ENV) or None
    if named is None:
        return state_dir / "ledger.sqlite"
    if is_url(named):
        return str(named)
    if isinstance(named, str) and "://" in named:
        scheme = named.split("://")[0]
        raise SpecError("--ledger", f"expected a file path or a postgresql:// URL, got a {scheme}:// URL")
    return Path(named).expanduser()


def wait_for_server(url: str, wait_s: float) -> None:
    """Connect once to the PostgreSQL ledger at `url`, trying again for up to `wait_s` while it is
    not up (a worker started before its database, a restart). SpecError naming --ledger for a URL
    that cannot mean a server; LedgerError, one line without the password, when it is not reached."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        port = str(conninfo_to_dict(url).get("port") or "5432")
    except psycopg.ProgrammingError as exc:
        raise SpecError("--ledger", f"not a usable postgresql:// URL: {_first_line(exc, url)}") from exc
    if not all(p.isdigit() for p in port.split(",")):
        raise SpecError("--ledger", f"not a usable postgresql:// URL: port {port!r} is not a number")
    from actor_run.protocols.logs import logger

    deadline, delay = time.monotonic() + wait_s, 0.1
    while True:
        try:
            psycopg.connect(url, connect_timeout=max(1, min(5, int(wait_s) or 1))).close()
            return
        except psycopg.Error as exc:
            if delay == 0.1 and wait_s > READ_WAIT_S:  # a long wait says so (a short one only if it fails)
                logger.warning("the ledger {} cannot be reached yet; waiting up to {:g} s for it", describe(url),
                               wait_s)
            if time.monotonic() + delay > deadline:
                raise LedgerError(f"the ledger {describe(url)} cannot be reached (waited {wait_s:g} s): "
                                  f"{_first_line(exc, url)}") from exc
            time.sleep(delay)  # the server is starting: a bounded backoff, no caller waits on anything else
            delay = min(delay * 2, 2.0)


def _first_line(exc: BaseException, url: str) -> str:
    """An error's first line, with the URL's password (if it quotes one) masked."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    m = re.search(r"://[^:/@]*:([^@]*)@", url)
    return text.replace(m.group(1), "***") if m and m.group(1) else text


def read_failures(backend: Backend) -> tuple[type[BaseException], ...]:
    """What a read raises when the database cannot answer it (away, restarting): its errors and ours."""
    return (LedgerError, *backend.errors)


def describe(location: str | Path) -> str:
    """The location without a password (for logs and messages)."""
    if not is_url(location):
        return str(location)
    return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", str(location))


# --- backends --------------------------------------------------------------------------------------


class Backend:
    """One engine: how to connect, begin, translate and migrate."""

    name = ""
    errors: tuple[type[Exception], ...] = ()
    fenced = False  # owners hold leases and job claims carry fencing tokens (PostgreSQL)
    now_sql = ""  # the database's clock, in seconds since the epoch

    def __init__(self, location: str | Path) -> None:
        self.location = location

    def describe(self) -> str:
        return describe(self.location)

    def connect(self) -> Any:
        raise NotImplementedError

    def begin_sql(self) -> str:
        raise NotImplementedError

    def in_transaction(self, conn: Any) -> bool:
        raise NotImplementedError

    def sql(self, text: str) -> str:
        return text

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """A connection to read with (borrowed from the pool on PostgreSQL)."""
        raise NotImplementedError
        yield

    def close(self) -> None:
        """Let go of what this backend holds (a reader's connection)."""

    def migrate(self, conn: Any) -> None:
        """Bring the schema up to date (schema.py's numbered steps); LedgerError if it cannot be."""
        try:
            migrate(conn)
        except SchemaError as exc:
            conn.close()
            raise LedgerUnusable(f"{self.describe()}: {exc}") from exc
        except self.errors as exc:
            conn.close()
            raise LedgerError(f"{self.describe()}: could not bring the ledger up to date: {exc}") from exc


def _set_wal(conn: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """WAL mode. Switching a new file to it takes an exclusive lock, and SQLite answers "database is
    locked" at once (no busy wait) to the other connections that open it at the same moment (several
    controllers starting on one new ledger): try again, within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class SqliteBackend(Backend):
    name = "sqlite"
    errors = (sqlite3.Error,)
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, location: str | Path, *, read_only: bool = False, missing_ok: bool = False) -> None:
        super().__init__(Path(location))
        self.path = Path(location)
        self.read_only = read_only  # a reading command: opens the file as it is, makes nothing
        self.missing_ok = missing_ok  # (read_only) no file yet reads as an empty ledger (the default one)
        self._reader: sqlite3.Connection | None = None

    def _connect_read_only(self) -> sqlite3.Connection:
        """The file opened read-only (SQLite's `mode=ro`): no folder, no file is made. LedgerUnusable,
        naming the path, for a missing file (unless `missing_ok`: an empty ledger in memory), an
        empty one, a file that is not SQLite or not actor-run's. A ledger an older actor-run wrote is
        opened for writing once, to be upgraded in place as any opener does."""
        if self.path.is_dir():
            raise LedgerUnusable(f"--ledger {self.path} is a folder, not a ledger file")
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            if not self.missing_ok:
                raise LedgerUnusable(f"--ledger {self.path}: no such ledger file") from None
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            self.migrate(conn)  # the tables, empty: every read finds no run
            return conn
        except OSError as exc:
            raise LedgerUnusable(f"--ledger {self.path}: cannot open it: {exc.strerror}") from exc
        if size == 0:
            raise LedgerUnusable(f"--ledger {self.path} is an empty file, not a ledger")
        try:
            with self.path.open("rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise LedgerUnusable(f"--ledger {self.path}: cannot open it: {exc.strerror}") from exc
        if head != b"SQLite format 3\0":
            raise LedgerUnusable(f"--ledger {self.path} is not an actor-run ledger (not an SQLite file)")
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30,
                                   isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=30000")
            version = version_of(conn)
        except sqlite3.Error as exc:
            raise LedgerUnusable(f"--ledger {self.path} is not an actor-run ledger (or is damaged): {exc}") from exc
        if version == 0:
            conn.close()
            raise LedgerUnusable(f"--ledger {self.path} is an SQLite file but not an actor-run ledger")
        if version < current_version():
            conn.close()
            return self._connect_writing()
        self.migrate(conn)  # refuses a newer actor-run's ledger, changes nothing here
        return conn

    def connect(self) -> sqlite3.Connection:
        """A connection to the file, made private (0600: SQLite gives its -wal and -shm files the
        same mode) if it is new. LedgerUnusable for a folder, a file that is not SQLite or is
        damaged, or a newer actor-run's ledger. Read-only (`read_only`): see _connect_read_only."""
        return self._connect_read_only() if self.read_only else self._connect_writing()

    def _connect_writing(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise LedgerUnusable(f"--ledger {self.path} is a folder, not a ledger file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                # made private before SQLite makes it. Never an open and close of a file SQLite has
                # open in this process: closing any descriptor of it drops that process's POSIX locks
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise LedgerUnusable(f"--ledger {self.path}: cannot open it: {exc}") from exc
        try:
            _set_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.DatabaseError as exc:
            conn.close()
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise LedgerError(f"{self.path}: {exc}") from exc
            raise LedgerUnusable(f"--ledger {self.path} is not an actor-run ledger (or is damaged): {exc}") from exc
        self.migrate(conn)
        return conn

    def begin_sql(self) -> str:
        return "BEGIN IMMEDIATE"

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        if self._reader is None:
            self._reader = self.connect()
        yield self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None



class PostgresBackend(Backend):
    name = "postgresql"
    fenced = True
    now_sql = "extract(epoch from clock_timestamp())::double precision"

    def __init__(self, location: str | Path) -> None:
        super().__init__(location)
        try:
            import psycopg
        except ImportError as exc:
            raise SpecError("--ledger", "a postgresql:// ledger needs psycopg: pip install 'actor-run[postgres]'"
                            ) from exc
        self.errors = (psycopg.Error,)
        self.url = str(location)
        add_url_password(self.url)  # masked wherever it would appear (protocols/redact.py)
        self._translated: dict[str, str] = {}
        self._tables: dict[str, tuple[list[str], list[str]]] = {}  # table -> (primary key, every column)
        self._lock = threading.Lock()

    def connect(self) -> _PgConn:
        import psycopg

        raw = psycopg.connect(self.url, autocommit=True)
        # a controller frozen inside a transaction (SIGSTOP, a cut network) must not hold its row
        # locks forever: the server ends such a session, and its transaction with it
        raw.execute("SET idle_in_transaction_session_timeout = '10s'")
        # where schema.py keeps the version, made by one controller at a time (IF NOT EXISTS alone
        # is not safe against a second one creating it at the same moment)
        raw.execute("SELECT pg_advisory_lock(7346115)")
        try:
            raw.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        finally:
            raw.execute("SELECT pg_advisory_unlock(7346115)")
        conn = _PgConn(raw, self)
        self.migrate(conn)
        self._load_tables(conn)
        return conn

    def begin_sql(self) -> str:
        return "BEGIN"

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    @contextmanager
    def reading(self) -> Iterator[_PgConn]:
        pool = _pool(self.url)
        with pool.connection() as raw:
            yield _PgConn(raw, self)  # (readers write nothing: no catalog for INSERT OR REPLACE needed)


    def _load_tables(self, conn: _PgConn) -> None:
        rows = conn.raw.execute(
            "SELECT c.table_name, c.column_name, c.ordinal_position,"
            " EXISTS (SELECT 1 FROM information_schema.table_constraints t"
            "  JOIN information_schema.key_column_usage k ON k.constraint_name = t.constraint_name"
            "   AND k.table_schema = t.table_schema AND k.table_name = t.table_name"
            "  WHERE t.constraint_type = 'PRIMARY KEY' AND t.table_schema = c.table_schema"
            "   AND t.table_name = c.table_name AND k.column_name = c.column_name)"
            " FROM information_schema.columns c WHERE c.table_schema = current_schema()"
            " ORDER BY c.table_name, c.ordinal_position").fetchall()
        tables: dict[str, tuple[list[str], list[str]]] = {}
        for table, column, _, primary in rows:
            keys, columns = tables.setdefault(table, ([], []))
            columns.append(column)
            if primary:
                keys.append(column)
        with self._lock:
            self._tables = tables
            self._translated.clear()

    def sql(self, text: str) -> str:
        done = self._translated.get(text)
        if done is None:
            done = _translate(text, self._tables)
            with self._lock:
                self._translated[text] = done
        return done


class _PgConn:
    """A psycopg connection that takes the ledger's SQL (translated by the backend)."""

    def __init__(self, raw: Any, backend: PostgresBackend) -> None:
        self.raw = raw
        self.backend = backend

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.raw.execute(self.backend.sql(sql), parameters or None)

    def executemany(self, sql: str, parameters: Any, /) -> Any:
        cur = self.raw.cursor()
        cur.executemany(self.backend.sql(sql), parameters)  # pipelined: one round trip for the lot
        return cur

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed or self.raw.broken)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.raw.info.transaction_status != TransactionStatus.IDLE)

    def close(self) -> None:
        self.raw.close()


_pools: dict[str, Any] = {}
_pools_lock = threading.Lock()


def _pool(url: str) -> Any:
    """One psycopg pool of read connections per database URL in this process (closed at exit)."""
    with _pools_lock:
        pool = _pools.get(url)
        if pool is None:
            import atexit

            from psycopg_pool import ConnectionPool

            # the pool logs each failed connect of an outage (python logging's last resort: stderr);
            # the ledger says once that the database is away, and once that it is back
            logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

            # a read waits for a connection at most READ_WAIT_S (not psycopg's 30 s): a command on a
            # database that is away says so soon, and a worker's poll is skipped, not stuck
            pool = ConnectionPool(url, min_size=0, max_size=4, kwargs={"autocommit": True, "connect_timeout": 5},
                                  open=True, name="actor-run-ledger", timeout=READ_WAIT_S)
            _pools[url] = pool
            if len(_pools) == 1:  # once per process however often the table empties and fills again
                atexit.unregister(close_pools)
                atexit.register(close_pools)
        return pool


def close_pools() -> None:
    """Close every read pool of this process (each keeps a thread of its own while open)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


def open_backend(location: str | Path, *, read_only: bool = False, missing_ok: bool = False) -> Backend:
    """The backend of `location`. `read_only` (SQLite): open the file as it is and make nothing,
    LedgerUnusable for a path that is no ledger (`missing_ok`: no file reads as an empty ledger)."""
    if is_url(location):
        return PostgresBackend(location)
    return SqliteBackend(location, read_only=read_only, missing_ok=missing_ok)


# --- translation to PostgreSQL ---------------------------------------------------------------------

_QUOTED_OR_MARK = re.compile(r"'[^']*'|\?|%")
_INSERT = re.compile(r"INSERT OR (REPLACE|IGNORE) INTO (\w+) \(([^)]*)\)(.*)", re.IGNORECASE | re.DOTALL)
_TYPES = [(re.compile(r"\bINTEGER PRIMARY KEY\b"), "BIGSERIAL PRIMARY KEY"), (re.compile(r"\bINTEGER\b"), "BIGINT"),
          (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"), (re.compile(r"\bBLOB\b"), "BYTEA")]


def _ddl(statement: str) -> str:
    if not statement.upper().startswith(("CREATE TABLE", "ALTER TABLE")):
        return statement
    for pattern, name in _TYPES:
        statement = pattern.sub(name, statement)
    return statement


def _marks(text: str) -> str:
    """`?` to `%s` and `%` to `%%`, outside quoted literals."""
    def one(m: re.Match[str]) -> str:
        s = m.group(0)
        return "%s" if s == "?" else "%%" if s == "%" else s

    return _QUOTED_OR_MARK.sub(one, text)


def _translate(text: str, tables: dict[str, tuple[list[str], list[str]]]) -> str:
    text = _ddl(text)
    m = _INSERT.fullmatch(text.strip())
    if m is not None:
        verb, table, columns, rest = m.groups()
        head = f"INSERT INTO {table} ({columns}){rest}"
        if verb.upper() == "IGNORE":
            text = head + " ON CONFLICT DO NOTHING"
        else:
            keys, every = tables.get(table, ([], []))
            if not keys:
                raise ValueError(f"INSERT OR REPLACE into {table}, which has no primary key in this ledger")
            named = [c.strip() for c in columns.split(",")]
            sets = [f"{c}=EXCLUDED.{c}" for c in named if c not in keys]
            sets += [f"{c}=DEFAULT" for c in every if c not in keys and c not in named]
            text = head + f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET " + ", ".join(sets)
    return _marks(text)


def run_many(conn: Any, sql: str, rows: Sequence[Any], sqlite_many: Callable[[Any, str, Sequence[Any]], None]) -> None:
    """A run of one statement: SQLite's as few multi-row statements (`sqlite_many`), PostgreSQL's
    as one pipelined executemany."""
    if isinstance(conn, _PgConn):
        conn.executemany(sql, rows)
    else:
        sqlite_many(conn, sql, rows)
