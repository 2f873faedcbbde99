"""bench/ledger.py, run as a user runs it (small figures): both backends take every event, three
workers share the batch on PostgreSQL and every job succeeds; the last line is its JSON object.
No figure is timed here: the bench measures, tests do not."""

from __future__ import annotations

import json
from pathlib import Path

from support.benches import run_bench


def test_a_small_ledger_bench_runs_both_backends_and_three_controllers(tmp_path: Path, bench_cwd: Path) -> None:
    proc = run_bench("ledger.py", "--events", "500", "--attempts", "5",
         "--job-seconds", "0.5", "--dir", str(tmp_path), timeout=300, cwd=bench_cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["sqlite_events_per_s"] > 0
    assert result["postgresql_events_per_s"] > 0
    assert result["job_states"] == {"succeeded": 15}
    assert sum(result["claimed"]) == 15  # each job claimed by exactly one of the three
    assert result["wall_over_ideal"] >= 1.0
    assert result["commits"] > 0
    assert result["postgres_cpu_s"] > 0
    # the baseline, the same path with one controller: on PostgreSQL and on SQLite
    assert result["one_postgresql_job_states"] == result["one_sqlite_job_states"] == {"succeeded": 5}
    assert result["one_postgresql_wall_over_ideal"] >= 1.0
    assert result["one_sqlite_wall_over_ideal"] >= 1.0
    assert list(tmp_path.iterdir()) == []
