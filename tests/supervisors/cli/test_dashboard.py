"""`actor-run dashboard` (supervisors/cli/dashboard.py) as a person uses it: opened in headless
Chromium against a live sim batch (on SQLite and on PostgreSQL), the page follows a job's progress
without a reload, renders hostile text as text, and cancels only with its token; `/metrics` parses
with the Prometheus client's own parser and agrees with the ledger."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.chromium import Page
from support.waits import poll

from actor_run.supervisors.ledger import Ledger, LedgerReader

CLI = [sys.executable, "-m", "actor_run"]
HOSTILE = '<img src=x onerror="document.title=1"><script>document.title=2</script>'
STEPS = 240  # two minutes of steps: the cancel below must find it running on a loaded machine


PROGRESSING = (f"for i in $(seq 1 {STEPS}); do echo \"{{\\\"stage\\\": \\\"e$i\\\", \\\"step\\\": $i, "
               f"\\\"total\\\": {STEPS}}}\" >> $ACTOR_RUN_PROGRESS; echo '{HOSTILE}'; sleep 0.5; done")


def batch(tmp_path: Path, command: str = PROGRESSING, seeds: str = "[1]", name: str = "batch.toml") -> Path:
    """A sim batch. PROGRESSING: each step a stage of its own (the ledger records each new stage, so
    another process sees the step move), and a hostile line in the log at each."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        [job]
        name = "dash"
        command = '''{command}'''
        seeds = {seeds}
        timeout_s = 600

        [policy]
        max_attempts = 1
        poll_s = 0.2
        setup_grace_s = 60
        stall_after_s = 60

        [[candidates]]
        cloud = "sim"
        gpu = "A100"

        [clouds.sim]
        launch_latency_s = 0.01
        delete_latency_s = 0.0
        """))
    return path


class Dashboard:
    """`actor-run dashboard` in a process of its own; `url` is what it printed (with the token)."""

    def __init__(self, ledger: str, state: Path, *extra: str) -> None:
        self.proc = subprocess.Popen([*CLI, "dashboard", "--ledger", ledger, "--state-dir", str(state),
                                      "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"(http://\S+)", line)
        assert found, line + (self.proc.stderr.read() if self.proc.stderr else "")
        self.url = found.group(1)
        self.base, _, query = self.url.partition("?")
        self.token = query.removeprefix("token=")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=30)


@pytest.fixture
def dashboard_of() -> Iterator[Any]:
    made: list[Dashboard] = []

    def make(ledger: str, state: Path, *extra: str) -> Dashboard:
        made.append(Dashboard(ledger, state, *extra))
        return made[-1]

    yield make
    for d in made:
        d.stop()


def sim_machines(state: Path) -> list[str]:
    folder = state / "sim" / "machines"
    return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []


def test_the_page_follows_a_live_batch_cancels_only_with_its_token_and_shows_hostile_text_as_text(
        tmp_path: Path, ledger_location: str | Path, dashboard_of: Any) -> None:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    ledger = str(ledger_location)
    env = {**os.environ, "ACTOR_RUN_LEDGER": ledger}
    run = subprocess.Popen([*CLI, "run", str(batch(tmp_path)), "--state-dir", str(state), "--out",
                            str(tmp_path / "out"), "--yes", "--json"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env=env)
    page: Page | None = None
    try:
        if "://" not in ledger:  # the dashboard reads a ledger that is there: the run makes it first
            poll(lambda: Path(ledger).exists() and Path(ledger).stat().st_size > 0, 120, "the run's ledger")
        board = dashboard_of(ledger, state)
        page = Page(board.url, tmp_path / "profile")

        def step() -> int | None:
            text = page.evaluate("document.querySelector('#jobs tbody') ? "
                                 "document.querySelector('#jobs tbody').innerText : ''")
            found = re.search(rf"(\d+)/{STEPS}", str(text))
            return int(found.group(1)) if found else None

        first = poll(step, 120, "the page to show the job's progress")
        loaded = page.evaluate("performance.timeOrigin")
        later = poll(lambda: (s := step()) is not None and s > first and s, 60, "the page's progress to move")
        assert later > first
        assert page.evaluate("performance.timeOrigin") == loaded  # the same page: no reload
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

        # the job's log, opened on the page: the hostile line is text, not markup
        page.evaluate("document.querySelector('#jobs tbody tr').click()")
        poll(lambda: "onerror" in str(page.evaluate("(document.getElementById('log') || {}).textContent || ''")),
             30, "the job's log on the page")
        assert page.evaluate("document.querySelectorAll('#log *, #jobs img, #jobs script').length") == 0
        assert page.evaluate("document.title") == "actor-run"
        assert page.evaluate("document.querySelectorAll('#jobs button').length") >= 1  # opened with the token

        # without the token: no cancel (403), and the same page without it shows no button
        run_id = poll(lambda: page.evaluate("document.getElementById('runid').textContent"), 30, "the run id")
        refused = httpx.post(board.base + "api/cancel", json={"run": run_id, "job": "dash/seed-1"}, timeout=30)
        assert refused.status_code == 403
        wrong = httpx.post(board.base + "api/cancel", json={"run": run_id, "job": "dash/seed-1"}, timeout=30,
                           headers={"Authorization": "Bearer " + "x" * 32})
        assert wrong.status_code == 403
        assert sim_machines(state)  # nothing was cancelled: the machine runs on
        bare = Page(board.base, tmp_path / "profile2")
        try:
            poll(lambda: bare.evaluate("document.querySelectorAll('#jobs tbody tr').length"), 60, "rows")
            assert bare.evaluate("document.querySelectorAll('#jobs button').length") == 0
        finally:
            bare.close()

        # with it: the job is canceled through the cancels table, its machine deleted
        asked = httpx.post(board.base + "api/cancel", json={"run": run_id, "job": "dash/seed-1"}, timeout=60,
                           headers={"Authorization": "Bearer " + board.token})
        assert asked.status_code == 200, asked.text
        run.communicate(timeout=120)
        poll(lambda: not sim_machines(state), 60, "the machine to be deleted")
        reader = LedgerReader(ledger)
        try:
            (job,) = reader.jobs(run_id)
        finally:
            reader.close()
        assert (job["state"], job["failure"]) == ("failed", "canceled")
    finally:
        if page is not None:
            page.close()
        if run.poll() is None:
            run.terminate()
            run.communicate(timeout=120)


def test_metrics_parse_with_the_prometheus_parser_and_match_the_ledger(
        tmp_path: Path, ledger_location: str | Path, dashboard_of: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    ledger = str(ledger_location)
    path = batch(tmp_path, "exit $(( {seed} == 2 ))", "[1, 2, 3]", "small.toml")
    done = subprocess.run([*CLI, "run", str(path), "--state-dir", str(state), "--out", str(tmp_path / "out"),
                           "--yes", "--json", "--ledger", ledger], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr  # seed 2 fails
    board = dashboard_of(ledger, state)
    text = httpx.get(board.base + "metrics", timeout=30).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("actor_run_jobs", (("state", "succeeded"),))] == 2
    assert samples[("actor_run_jobs", (("state", "failed"),))] == 1
    assert samples[("actor_run_attempts_ended_total", (("code", "job_failed"), ("outcome", "failed")))] == 1
    assert samples[("actor_run_attempts_ended_total", (("code", ""), ("outcome", "succeeded")))] == 2
    reader = LedgerReader(ledger)
    try:
        spent = sum(a["usd"] or 0.0 for a in reader.attempts())
    finally:
        reader.close()
    assert samples[("actor_run_spend_dollars_total", ())] == pytest.approx(spent)
    assert not any("seed" in k for _, labels in samples for k, _ in labels)  # no unbounded label


def test_off_loopback_every_request_needs_the_token(tmp_path: Path, dashboard_of: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    ledger = str(state / "ledger.sqlite")
    Ledger(ledger, "0" * 32).close()  # an empty ledger
    board = dashboard_of(ledger, state, "--host", "0.0.0.0")
    local = board.base.replace("0.0.0.0", "127.0.0.1")
    assert httpx.get(local, timeout=30).status_code == 403
    assert httpx.get(local + "metrics", timeout=30).status_code == 403
    assert httpx.get(local, params={"token": board.token}, timeout=30).status_code == 200
