"""bench/scaleout.py, run as a user runs it (small figures): three workers share a batch on one
PostgreSQL, each job is claimed by one of them and succeeds, a killed worker's jobs are adopted by
the others and succeed too; the last line is its JSON object. No figure is timed here."""

from __future__ import annotations

import json
from pathlib import Path

from support.benches import run_bench


def test_a_small_scaleout_bench_shares_the_batch_and_adopts_a_killed_workers_jobs(
    tmp_path: Path, bench_cwd: Path,
) -> None:
    proc = run_bench("scaleout.py", "--workers", "3", "--jobs", "9", "--job-seconds", "1",
         "--lease", "6", "--poll", "0.5", "--dir", str(tmp_path), timeout=600, cwd=bench_cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["job_states"] == {"succeeded": 9}
    assert sum(r["jobs_per_worker"]) == 9  # each job claimed by exactly one worker
    assert len(r["jobs_per_worker"]) == 3
    assert r["attempts"] == 9
    assert 0 < r["claim_p50_s"] <= r["claim_p99_s"]
    assert r["statements_per_attempt"] > 0
    assert r["transactions_per_attempt"] > 0
    assert r["wall_over_ideal"] >= 1.0
    assert r["adopt_jobs"] >= 3  # the killed worker held a third or more
    assert r["adopt_left_unadopted"] == 0
    assert r["adopt_s"] >= r["adopt_lease_left_s"]  # nobody adopts before the lease runs out
    assert r["adopt_job_states"] == {"succeeded": 9}
    assert list(tmp_path.iterdir()) == []
