"""supervisors/ledger/core.py: a write that fails for a reason that is not the database's (an int no
column holds is an OverflowError, not a database error) never kills the writer thread. Before,
the thread died, every waiter waited forever, and the controller ignored SIGINT and SIGTERM with
its other seeds stalled; now the waiters get the error, `on_failure` is told once, the writes after
it are made, and a Runner ends its run with every machine deleted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actor_run.protocols.specs import Job
from actor_run.supervisors.ledger import Ledger, LedgerError, LedgerReader
from actor_run.supervisors.ledger.reader import MachineRow


def machines(state_dir: Path) -> list[MachineRow]:
    reader = LedgerReader(state_dir / "ledger.sqlite")
    try:
        return reader.machines()
    finally:
        reader.close()


def test_a_write_no_column_holds_fails_its_waiter_and_the_writer_lives_on(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite", "0" * 32, run="r1")
    told: list[BaseException] = []
    ledger.on_failure = told.append
    try:
        ledger.start_run("r1", batch="b", out_dir=str(tmp_path))
        ledger.record_job(key="t/seed-1", name="t", seed=2**64, spec=b"{}", state="running", out_dir=str(tmp_path))
        with pytest.raises(LedgerError, match="OverflowError"):
            ledger.flush()  # queued behind the bad write, in the same batch: told, not left waiting
        assert [type(e) for e in told] == [OverflowError]
        ledger.record_job(key="t/seed-2", name="t", seed=2, spec=b"{}", state="running", out_dir=str(tmp_path))
        ledger.flush()  # the writer thread lives on: the next write is made
        assert told[1:] == []  # told once
    finally:
        ledger.close()
    reader = LedgerReader(tmp_path / "ledger.sqlite")
    try:
        assert [j["key"] for j in reader.jobs("r1")] == ["t/seed-2"]
    finally:
        reader.close()


def test_a_failed_write_ends_the_runners_run_and_deletes_its_machines(
    open_runner: Callable[..., Any], local_job: Callable[..., Job], state_dir: Path,
) -> None:
    with open_runner() as r:
        handle = r.submit(local_job("long", "sleep 600"))
        from support.waits import poll

        poll(lambda: any(m.state == "alive" and m.work for m in machines(state_dir)), 60, "the job started")
        r.ledger.record_job(key="bad/seed-1", name="bad", seed=2**64, spec=b"{}", state="running", out_dir="/x")
        ended = handle.result(120)  # not a run that waits forever on a dead writer
    assert (ended.outcome, ended.failure) == ("failed", "internal")
    assert "ledger" in ended.detail
    assert all(m.state != "alive" for m in machines(state_dir))  # its machine deleted
