"""supervisors/views/report.py laid out in headless Chromium (issue 29.12): failure labels of short
failed attempts side by side never overlap (the page measures their boxes after it staggered them),
and the time axis has round ticks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "actor_run"]
ENV = {**os.environ, "NO_COLOR": "1"}

BATCH = """\
[job]
name = "flaky"
command = "true"
seeds = [1, 2]

[policy]
max_attempts = 12
backoff_s = 0.01
backoff_max_s = 0.02
poll_s = 0.1

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.01
launch_failure_rate = 0.8
"""


def dom_of(page: Path, profile: Path) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe is not None, "chromium is not installed (scripts/test.sh installs it)"
    done = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
         "--no-first-run", "--no-pings", "--disable-breakpad", f"--user-data-dir={profile}",
         "--window-size=1200,900", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
        check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_failure_labels_side_by_side_never_overlap_and_ticks_are_round(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(BATCH)
    common = ["--state-dir", str(tmp_path / "state")]
    done = subprocess.run([*CLI, "run", str(tmp_path / "b.toml"), *common, "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode in (0, 1), done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    failed = [e for e in events if e["type"] == "AttemptEnded" and e["failure"]]
    assert len(failed) >= 3, "the sim's failure rate made too few failed attempts to lay out"
    page = tmp_path / "report.html"
    made = subprocess.run([*CLI, "report", events[0]["run"], "--out", str(page), *common], capture_output=True,
                          text=True, timeout=60, env=ENV)
    assert made.returncode == 0, made.stderr
    dom = dom_of(page, tmp_path / "chromium")
    assert 'data-ready="1"' in dom
    assert len(re.findall(r'<div class="fail"', dom)) == len(failed)
    assert 'data-overlaps="0"' in dom  # every pair of failure labels' boxes, measured in the page
    ticks = [float(v) for v in re.findall(r'class="tick" [^>]*data-value="([0-9.]+)"', dom)]
    assert len(ticks) >= 3
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** __import__("math").floor(__import__("math").log10(step))
    assert round(mantissa, 6) in (1.0, 2.0, 5.0)
    assert all(abs(t - i * step) < 1e-6 for i, t in enumerate(ticks))
