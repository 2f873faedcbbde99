"""supervisors/ledger/team.py and `actor-run budget`: a team budget across runs holds exactly under
concurrency (threads racing for the last dollars on SQLite and on a real PostgreSQL; two controllers
running batches that draw on one $10 budget), and `cost --by budget` shows what it spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from support.cli_inproc import run_cli

from actor_run.supervisors.ledger import Ledger, LedgerReader, team

CLI = [sys.executable, "-m", "actor_run"]


def _row(run: str, job: str, attempt: int, usd: float) -> dict[str, object]:
    return {"run": run, "job": job, "attempt": attempt, "owner": "o", "cloud": "sim", "account": "", "region": "r",
            "gpu": "A100", "hourly_usd": 1.0, "hold_s": 1.0, "usd": usd, "state": "live", "seq": attempt,
            "reserved_at": 1.0, "limit_usd": None}


def test_threads_racing_for_the_last_dollars_never_hold_past_the_limit(ledger_location: str | Path) -> None:
    Ledger(ledger_location, "0" * 32).close()  # the ledger, at this version
    team.set_budget(ledger_location, "team-a", 10.0, "total")
    held: list[bool] = []
    lock = threading.Lock()

    def take(worker: int) -> None:
        for i in range(8):
            answer = team.hold(ledger_location, budget="team-a", row=_row(f"run{worker}", f"j/seed-{i}", 0, 1.0))
            with lock:
                held.append(answer.ok)

    threads = [threading.Thread(target=take, args=(w,), name=f"test-team-{w}") for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(held) == 32
    assert sum(held) == 10  # exactly the limit: never eleven, and no dollar left unused
    (b,) = team.budgets(ledger_location)
    assert (b.name, b.usd, b.reserved_usd, b.spent_usd) == ("team-a", 10.0, 10.0, 0.0)
    refused = team.hold(ledger_location, budget="nobody", row=_row("r", "x/seed-1", 0, 0.5))
    assert refused.ok is False
    assert refused.budget is None


def test_periods_start_where_the_calendar_says() -> None:
    first = 1764547200.0  # 2025-12-01 00:00 UTC, a Monday
    assert team.period_start("week", first + 3 * 86400 + 3600) == first
    assert team.period_start("week", first + 8 * 86400) == first + 7 * 86400
    assert team.period_start("month", first + 20 * 86400) == first
    assert team.period_start("month", first - 3600) == first - 30 * 86400  # 2025-11-01
    assert team.period_start("total", first) == 0.0


def _batch(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(textwrap.dedent(f"""\
        [job]
        name = "{name}"
        command = "sleep 2"
        seeds = [1, 2, 3, 4]
        timeout_s = 60

        [policy]
        max_attempts = 1
        poll_s = 0.2
        setup_grace_s = 30
        last_grace_factor = 1.0
        budget = "team-a"
        on_budget_full = "end"  # a job that finds the budget full ends `budget` (test_team_waits.py: "wait")

        [[candidates]]
        cloud = "sim"
        gpu = "A100"

        [clouds.sim]
        launch_latency_s = 0.01
        delete_latency_s = 0.0
        regions = [{{ name = "us-east", gpus = {{ A100 = {{ stock = 16, hourly_usd = 120.0 }} }} }}]
        """))
    return path


def test_two_controllers_drawing_on_one_10_dollar_budget_never_reserve_past_it_together(
        tmp_path: Path, ledger_location: str | Path) -> None:
    ledger = str(ledger_location)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    env = {**os.environ, "ACTOR_RUN_LEDGER": ledger}
    common = ["--state-dir", str(state)]
    Ledger(ledger, "0" * 32).close()
    done = run_cli(["budget", "set", "team-a", "--usd", "10", "--per", "total", *common], timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    runs = [subprocess.Popen([*CLI, "run", str(_batch(tmp_path, name)), *common, "--out", str(tmp_path / "out"),
                              "--yes", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for name in ("a", "b")]
    outs = [r.communicate(timeout=300) for r in runs]
    ended = [json.loads(line) for out, _ in outs for line in out.splitlines()
             if line.startswith("{") and json.loads(line).get("type") == "JobEnded"]
    assert len(ended) == 8, [err[-2000:] for _, err in outs]
    reader = LedgerReader(ledger)
    try:
        rows = [r for r in reader.reservations() if r.get("budget") == "team-a"]
    finally:
        reader.close()
    assert rows
    assert all(r["usd"] == 3.0 for r in rows)  # 120 $/h x (60 s + 30 s)
    # at every reservation: what the budget held then (live ones, and charges made before) fits in $10
    for r in rows:
        t = r["reserved_at"]
        live = sum(x["usd"] for x in rows if x["reserved_at"] <= t and (x["released_at"] or 1e18) > t)
        charged = sum(x["charged"] or 0.0 for x in rows if x["released_at"] is not None and x["released_at"] <= t)
        assert live + charged <= 10.0 + 1e-6, (r, live, charged)
    refused = [e for e in ended if e.get("failure") == "budget"]
    assert refused  # eight jobs of $3 each cannot all hold $10 at once: some were turned away
    assert all("team budget 'team-a'" in e["detail"] for e in refused)
    shown = run_cli(["cost", "--all", "--by", "budget", "--json", *common], timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    spent = sum(x["charged"] or 0.0 for x in rows)
    groups = [json.loads(line) for line in shown.stdout.splitlines()]
    assert any(g.get("group") == "team-a" for g in groups), groups
    assert abs(sum(g.get("spent_usd", 0.0) for g in groups if g.get("group") == "team-a") - spent) < 1e-6
    show = run_cli(["budget", "show", "team-a", "--json", *common], timeout=60, env=env)
    (b,) = [json.loads(line) for line in show.stdout.splitlines()]
    assert b["reserved_usd"] == 0.0  # every machine gone, every reservation replaced by its charge
    assert abs(b["spent_usd"] - spent) < 1e-6
