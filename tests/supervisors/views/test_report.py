"""supervisors/views/report.py, report_page.py and `actor-run report`: the page of a real sim batch
with a walk (one place with stock for one machine: the others walk on) and a retry (a job that
stalls on its first run), opened in headless Chromium (Debian's package; scripts/test.sh installs
it): once the page's script has run, the timeline has one row per job and one span per phase of each
attempt, and each failed attempt is marked with its code."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from support.chromium import chromium_dom
from test_cli import CLI, Paths, batch, cli

from actor_run.supervisors.ledger import LedgerReader

BATCH = """\
[job]
name = "t"
command = "sh -c 'if [ {{seed}} = 1 ] && mkdir {tmp}/stalled 2>/dev/null; then sleep 30; fi; echo ok'"
code = "code"
seeds = [1, 2, 3]

[policy]
concurrency = 3
poll_s = 0.1
setup_grace_s = 1.5
last_grace_factor = 1.0
backoff_s = 0.05
max_attempts = 4

[[candidates]]
cloud = "sim"
gpu = "H100"

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.2
delete_latency_s = 0.05

[[clouds.sim.regions]]
name = "r1"
gpus = {{ H100 = {{ stock = 1, hourly_usd = 3.0 }} }}

[[clouds.sim.regions]]
name = "r2"
gpus = {{ A100 = {{ stock = 8, hourly_usd = 1.5 }} }}
"""

# what the report draws, from the events: a phase for each step an attempt reached
PHASE_OF = {"AttemptStarted": "lease", "Leased": "upload", "Uploaded": "run", "Exited": "fetch", "Released": "release"}


def test_the_report_of_a_batch_with_a_walk_and_a_retry_in_chromium(paths: Paths) -> None:
    path = batch(paths.tmp, BATCH.format(tmp=paths.tmp))
    done = cli(paths.run_args(path, "--json"), timeout=180)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    failed = [e for e in events if e["type"] == "AttemptEnded" and e["failure"]]
    codes = {e["failure"] for e in failed}
    assert "stalled" in codes  # the retry
    assert "no_capacity" in codes  # the walk: one H100 for three jobs
    expected = Counter(PHASE_OF[e["type"]] for e in events if e["type"] in PHASE_OF)
    run = events[0]["run"]

    page = paths.tmp / "report.html"
    made = cli([*CLI, "report", run, "--out", str(page), *paths.common()])
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(page)
    text = page.read_text()
    assert "http://" not in text
    assert "https://" not in text  # nothing to fetch: the page is whole

    dom = chromium_dom(page, paths.tmp / "chromium")
    assert 'data-ready="1"' in dom  # the page's script ran to its end
    rows = re.findall(r'<div class="tl-row" data-job="([^"]+)"', dom)
    assert sorted(rows) == ["t/seed-1", "t/seed-2", "t/seed-3"]
    spans = Counter(re.findall(r'<div class="span phase-(\w+)"', dom))
    assert spans == expected
    marks = Counter(re.findall(r'<div class="fail" data-code="(\w+)"', dom))
    assert marks == Counter(e["failure"] for e in failed)
    # cost by cloud and GPU; the walk's candidates; the jobs
    assert re.search(r"<td>sim</td><td>H100</td><td>\$[0-9.]+</td>", dom)
    assert re.search(r"<td>sim</td><td>A100</td><td>\$[0-9.]+</td>", dom)
    assert re.search(r"<td>1</td><td>sim r2 A100</td>", dom)
    assert all(f"<td>t/seed-{n}</td>" in dom for n in (1, 2, 3))
    # each attempt links to its seed's log.txt, relative to the page, and the file is there
    links = re.findall(r'<a class="log" data-attempt="(\d+)" href="([^"]+)">', dom)
    attempts = [e for e in events if e["type"] == "AttemptStarted"]
    assert len(links) == len(attempts)
    for _, href in links:
        assert not href.startswith(("http:", "https:", "/"))
        assert (page.parent / href).resolve().name == "log.txt"
        assert (page.parent / href).resolve().is_file(), href
    assert {str((page.parent / h).resolve().parent.name) for _, h in links} == {"seed-1", "seed-2", "seed-3"}
    # the timeline's rows and spans lead there too
    assert len(re.findall(r'<div class="tl-label"><a href="[^"]+log\.txt" class="log">', dom)) == 3


def test_report_of_an_unknown_run_exits_2_with_one_line(paths: Paths) -> None:
    LedgerReader(paths.ledger).close()  # a ledger with no run (a missing one is its own exit 2: test_newcomer.py)
    done = cli([*CLI, "report", "nosuchrun", *paths.common()])
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["actor-run: RUN: no run 'nosuchrun' in this ledger (see `actor-run runs`)"]


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)
