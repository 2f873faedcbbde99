"""supervisors/views/report_page.py laid out in headless Chromium (issue 29.12): failure labels of short
failed attempts side by side never overlap (the page measures their boxes after it staggered them),
and the time axis has round ticks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

from support.chromium import chromium_dom
from support.cli_inproc import CLI, run_cli

from actor_run.supervisors.ledger import LedgerReader

ENV = {**os.environ, "NO_COLOR": "1"}

BATCH = """\
[job]
name = "flaky"
command = "true"
seeds = [1, 2]

[policy]
max_attempts = 6
backoff_s = 0.01
backoff_max_s = 0.02
poll_s = 0.1

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.01
launch_failure_rate = 1.0  # every attempt fails: short failed attempts side by side, every run
"""


def test_failure_labels_side_by_side_never_overlap_and_ticks_are_round(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(BATCH)
    common = ["--state-dir", str(tmp_path / "state")]
    done = run_cli(["run", str(tmp_path / "b.toml"), *common, "--out", str(tmp_path / "out"), "--json"],
                          timeout=180, env=ENV)
    assert done.returncode in (0, 1), done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    failed = [e for e in events if e["type"] == "AttemptEnded" and e["failure"]]
    assert len(failed) == 12, "every attempt of both seeds fails"
    page = tmp_path / "report.html"
    made = run_cli(["report", events[0]["run"], "--out", str(page), *common], timeout=60, env=ENV)
    assert made.returncode == 0, made.stderr
    dom = chromium_dom(page, tmp_path / "chromium", window="1200,900")
    assert 'data-ready="1"' in dom
    assert len(re.findall(r'<div class="fail"', dom)) == len(failed)
    assert 'data-overlaps="0"' in dom  # every pair of failure labels' boxes, measured in the page
    ticks = [float(v) for v in re.findall(r'class="tick" [^>]*data-value="([0-9.]+)"', dom)]
    assert len(ticks) >= 3
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** __import__("math").floor(__import__("math").log10(step))
    assert round(mantissa, 6) in (1.0, 2.0, 5.0)
    assert all(abs(t - i * step) < 1e-6 for i, t in enumerate(ticks))


GATED = r'''
import os, time
for _ in range(2400):  # hold until the test opens the gate (bounded: 120 s)
    if os.path.exists(os.environ["GATE"]):
        break
    time.sleep(0.05)  # the job (another process) holds, bounded, until the test opens its gate
print("done")
'''


def test_a_killed_then_resumed_run_shows_its_budget_reservations_and_gap(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text(GATED)
    (tmp_path / "b.toml").write_text(f"""
[job]
name = "gated"
command = "python3 job.py"
code = "code"
seeds = [1, 2]
timeout_s = 120
env = {{ GATE = "{tmp_path / 'gate'}" }}
public_env = ["GATE"]

[policy]
concurrency = 2
budget_usd = 50.0
poll_s = 0.1
setup_grace_s = 30
stall_after_s = 60
lost_after_s = 60

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.05
delete_latency_s = 0.0
state_dir = "{tmp_path / 'sim'}"
regions = [{{ name = "r1", gpus = {{ A100 = {{ stock = 4, hourly_usd = 3.0 }} }} }}]
""")
    common = ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen([*CLI, "run", str(tmp_path / "b.toml"), *common, "--out", str(tmp_path / "out"), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    assert proc.stdout is not None
    assert proc.stderr is not None
    uploaded: set[int] = set()
    run = ""
    for line in proc.stdout:  # kill -9 once both seeds run on their machines
        event = json.loads(line)
        run = event["run"]
        if event["type"] == "Uploaded":
            uploaded.add(event["seed"])
            if len(uploaded) == 2:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    proc.stderr.close()
    assert uploaded == {1, 2}
    (tmp_path / "gate").touch()
    resumed = run_cli(["resume", "--out", str(tmp_path / "out"), *common], timeout=180, env=ENV, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    reader = LedgerReader(tmp_path / "state" / "ledger.sqlite")
    try:
        reservations = reader.reservations(run)
        owners = {e["owner"] for e in reader.events(run=run)}
    finally:
        reader.close()
    assert len(owners) == 2  # the killed controller and the one that resumed
    assert reservations

    page = tmp_path / "report.html"
    made = run_cli(["report", run, "--out", str(page), *common], timeout=60, env=ENV)
    assert made.returncode == 0, made.stderr
    dom = chromium_dom(page, tmp_path / "chromium", window="1200,900")
    assert 'data-ready="1"' in dom
    # the budget and the reservations, as the ledger holds them
    budget = re.search(r'<table class="budget">.*?</table>', dom, re.S)
    assert budget is not None
    cells = dict(re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td></tr>", budget.group(0)))
    assert cells["budget"] == "$50.0000"
    reserved = sum(r["usd"] for r in reservations)
    assert cells["reservations"] == f"{len(reservations)}: ${reserved:.4f} set aside"
    charged = sum(r["charged"] or 0.0 for r in reservations if r["state"] != "live")
    assert cells["charged"] == f"${charged:.4f}"
    # a gap on each seed's row: from the killed controller's last event to the adopter's first
    row_re = r'<div class="tl-row" data-job="([^"]+)">(.*?)(?=<div class="tl-row"|</div>\s*<h2>)'
    rows = {m.group(1): m.group(2) for m in re.finditer(row_re, dom, re.S)}
    assert sorted(rows) == ["gated/seed-1", "gated/seed-2"]
    for key, row in rows.items():
        gap = re.search(r'<div class="gap" data-attempt="\d+"[^>]* style="left: ([0-9.]+)%; width: ([0-9.]+)%;', row)
        assert gap is not None, key
        assert float(gap.group(2)) > 0, key
