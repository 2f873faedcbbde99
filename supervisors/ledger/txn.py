"""How the ledger's writer runs a batch of writes in one transaction: statement by statement as
queued, except that runs of one statement go to the database together (SQLite: as multi-row
statements, `_run_many`; PostgreSQL: one pipelined executemany), table by table between function
ops (`_run_all`). Every rewrite leaves what one write after the other would leave."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from actor_run.supervisors.ledger.db import Conn, run_many

# a write: (sql, parameters) (consecutive ones of the same sql go to the database together: _run_many),
# or a function of the connection for what needs more (a compare-and-set that reads its rowcount)
Op = tuple[str, Any] | Callable[[Conn], Any]


def _run(conn: Conn, op: Op) -> None:
    if isinstance(op, tuple):
        conn.execute(*op)
    else:
        op(conn)


def _run_all(conn: Conn, ops: list[Op]) -> None:
    """Every op, in one transaction, as if in order. Between two function ops, the statements are
    taken table by table (each table's in their order): a statement that writes one table and reads
    no other commutes with those on other tables, and the transaction is seen whole or not at all.
    So a thousand attempts' events, intents and job rows, queued interleaved, go to SQLite as a
    few multi-row statements (_run_many) instead of one per short run: each statement costs a GIL
    hand-off or two, up to 5 ms each on a busy process (600 statements took 200 ms there)."""
    segment: dict[str, list[Op]] = {}
    for op in ops:
        table = _table_of(op)
        if table is None:  # a function, or a statement that may read another table: a barrier
            for group in segment.values():
                _run_runs(conn, group)
            segment = {}
            _run_runs(conn, [op])
        else:
            segment.setdefault(table, []).append(op)
    for group in segment.values():
        _run_runs(conn, group)


_WRITES_ONE_TABLE = re.compile(r"(?:INSERT(?: OR \w+)? INTO|UPDATE) (\w+) ", re.IGNORECASE)
_READS = re.compile(r"\b(SELECT|FROM|JOIN)\b", re.IGNORECASE)  # may read another table
_tables: dict[str, str | None] = {}


def _table_of(op: Op) -> str | None:
    """The one table a statement writes, if it reads no other; None for a function op."""
    if not isinstance(op, tuple):
        return None
    sql = op[0]
    if sql not in _tables:
        m = _WRITES_ONE_TABLE.match(sql)
        _tables[sql] = m.group(1) if m and not _READS.search(sql) else None
    return _tables[sql]


def _run_runs(conn: Conn, ops: list[Op]) -> None:
    """Ops in order; a run of the same statement goes to SQLite as few statements (_run_many)."""
    i, n = 0, len(ops)
    while i < n:
        op = ops[i]
        if not isinstance(op, tuple):
            op(conn)
            i += 1
            continue
        sql, j = op[0], i + 1
        while j < n and isinstance(ops[j], tuple) and ops[j][0] == sql:  # type: ignore[index]
            j += 1
        if j == i + 1:
            conn.execute(sql, op[1])
        else:
            run_many(conn, sql, [o[1] for o in ops[i:j]], _run_many)  # type: ignore[index]
        i = j


def _run_many(conn: sqlite3.Connection, sql: str, rows: Sequence[Any]) -> None:
    """`executemany(sql, rows)`, as a few statements of many rows each.

    sqlite3 lets go of the GIL for every row it steps, and on a busy process each time costs up to
    the switch interval (5 ms) to get it back: 200 rows took 1.7 s beside one busy thread, against
    52 ms as multi-row statements (bench/convoy.py). So `INSERT ... VALUES (?,..)` becomes one
    INSERT of many VALUES rows, and `UPDATE t SET .. WHERE ..` one `UPDATE t SET .. FROM (VALUES
    ..) AS v WHERE ..` (each `?` read from v's columns), both with the same effect as one row after
    the other. An UPDATE stays an executemany when that could differ: its WHERE values repeat
    within the run (UPDATE FROM would apply only one of them), or its WHERE is more than equalities
    on columns it does not set (_parse_bulk)."""
    bulk = _bulk_form(sql)
    if bulk is None:
        conn.executemany(sql, rows)
        return
    head, group, tail, where_at = bulk
    if where_at is not None and len({tuple(r[where_at:]) for r in rows}) < len(rows):
        conn.executemany(sql, rows)
        return
    per = max(1, min(_MAX_ROWS, _MAX_VARIABLES // max(group.count("?"), 1)))
    for k in range(0, len(rows), per):
        chunk = rows[k:k + per]
        conn.execute(head + ",".join([group] * len(chunk)) + tail, [x for r in chunk for x in r])


_MAX_ROWS = 500
_MAX_VARIABLES = 999  # SQLite's smallest default limit on `?` in one statement
_QUOTED = re.compile(r"'[^']*'")
_EQUALITIES = re.compile(r"\w+=(\?|'[^']*')( AND \w+=(\?|'[^']*'))*")  # a=? AND b='x' ...
_COMPARED = re.compile(r"(\w+)=\?")  # the columns a WHERE compares with a parameter
_BulkForm = tuple[str, str, str, int | None]
_bulk_forms: dict[str, _BulkForm | None] = {}


def _bulk_form(sql: str) -> _BulkForm | None:
    """`sql` as (head, the VALUES row, tail, where the WHERE's values start in a row or None for
    an INSERT): the statement for k rows is head + k rows joined by commas + tail. None for any
    other shape (or a `?` inside quotes)."""
    if sql not in _bulk_forms:
        _bulk_forms[sql] = _parse_bulk(sql)
    return _bulk_forms[sql]


def _parse_bulk(sql: str) -> _BulkForm | None:
    if '"' in sql or "?" in "".join(_QUOTED.findall(sql)):
        return None
    words = sql.split()
    if words[0].upper() == "INSERT":
        before, sep, rest = sql.partition(" VALUES (")
        group, _, tail = rest.partition(")")
        if not sep or "(" in group or "'" in group or " VALUES (" in rest:
            return None
        return before + " VALUES ", "(" + group + ")", tail, None
    if (words[0].upper() == "UPDATE" and sql.count(" WHERE ") == 1 and " FROM " not in sql.upper()
            and sqlite3.sqlite_version_info >= (3, 33)):  # UPDATE FROM came in SQLite 3.33
        set_part, _, where = sql.partition(" WHERE ")
        # row after row equals one UPDATE FROM only if each row's WHERE picks its rows by equalities
        # on columns no row of the run sets: then distinct WHERE values touch distinct rows
        assigned = {c.split("=")[0].strip() for c in set_part.partition(" SET ")[2].split(",")}
        if not _EQUALITIES.fullmatch(where.strip()) or assigned & set(_COMPARED.findall(where)):
            return None
        names = iter(range(1, sql.count("?") + 1))

        def to_columns(text: str) -> str:  # the k-th `?` of the statement reads v.columnk
            return "".join(f"v.column{next(names)}" if c == "?" else c for c in text)

        head, tail = to_columns(set_part) + " FROM (VALUES ", ") AS v WHERE " + to_columns(where)
        return head, "(" + ",".join("?" * sql.count("?")) + ")", tail, set_part.count("?")
    return None
