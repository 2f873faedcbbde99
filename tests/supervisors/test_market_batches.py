"""Whole batches on the marketplace clouds (issue 45), through `actor-run` against the project's
fakes of Vast.ai and Shadeform (held to the vendors' OpenAPI documents, machines that are real sshd
logins), as untidy as the contracts say: an ambiguous create, a dead instance, a 429, listing lag,
an outbid bid, a reclaimed spot instance, a provider-kept deadline. The checks every rented cloud
passes (a stale machine deleted at a run's start and by `actor-run sweep`, kill -9 and resume, ...)
run on both in test_rented_batches.py and test_first_run.py (FAKES holds them)."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fakes.batch_kit import cli, env, events, kill9, read_until, write_batch
from fakes.providers import serve
from support.cli_inproc import start_cli
from support.waits import poll

VAST_KEY = "vast-key-0123456789abcdef-market"
SHADE_KEY = "shade-key-fedcba9876543210-market"


@pytest.fixture
def vast(tmp_path: Path) -> Iterator[Any]:
    yield from serve("vastai", tmp_path)


@pytest.fixture
def shadeform(tmp_path: Path) -> Iterator[Any]:
    yield from serve("shadeform", tmp_path)


def interruptible(batch: Path, gpu: str) -> Path:
    batch.write_text(batch.read_text().replace(f'gpu = "{gpu}"\n', f'gpu = "{gpu}"\ninterruptible = true\n', 1))
    return batch


def lag(batch: Path) -> Path:
    """Reads may lag a create by seconds on a loaded machine: the settings allow for it, as Vast's
    default (60 s) does."""
    batch.write_text(batch.read_text().replace("listing_lag_s = 1.0", "listing_lag_s = 30"))
    return batch


def start(tmp: Path, batch: Path, key_var: str, key: str) -> Any:
    return start_cli(["run", str(batch), "--json", "--out", str(tmp / "out"), "--state-dir", str(tmp / "state")],
                     cwd=tmp, env=env(key_var, key))


def files_holding(root: Path, secret: str) -> list[str]:
    """Every file under `root` whose bytes hold `secret` (the state dir, the outputs, the logs)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def ended(out: str) -> list[tuple[str, str | None]]:
    return [(e["outcome"], e.get("failure")) for e in events(out) if e["type"] == "AttemptEnded"]


def test_a_3_seed_vast_batch_through_vast_s_traps_leaves_only_someone_else_s_instance(
        tmp_path: Path, vast: Any) -> None:
    theirs = vast.foreign("team-notebook")
    vast.token = VAST_KEY
    with vast.lock:
        vast.create_500_made = 1  # the first create makes its instance and answers 502
        vast.launch_answers = ["", "exited"]  # the second's instance dies loading
        vast.lag_reads = 2  # new instances read null, and are missing from the list, a while
    vast.rate_limit(2)  # plain text, no Retry-After
    batch = write_batch(tmp_path, "vastai", vast.url, gpus=list(vast.GPUS), seeds=[1, 2, 3], settings=vast.settings())
    lag(batch)
    done = cli(tmp_path, "run", str(batch), "--json", "--out", str(tmp_path / "out"), key_var="VAST_API_KEY",
               key=VAST_KEY)
    assert done.returncode == 0, done.stderr[-3000:]
    for seed in (1, 2, 3):
        assert (tmp_path / "out" / "latest" / "rented" / f"seed-{seed}" / "out" / "result.txt").read_text() == (
            f"{seed} payload")
    failures = sorted(f for o, f in ended(done.stdout) if o == "failed")
    assert "ambiguous_create" in failures
    assert "launch_failed" in failures
    assert vast.rate_limited_sent == 2
    assert vast.alive() == ["team-notebook"]  # none of ours left; theirs untouched
    assert vast.instances[int(theirs)]["actual_status"] == "running"
    assert all(b["label"].startswith("ar-") for b in vast.created)
    cost = cli(tmp_path, "cost", "--by", "cloud", "--json", key_var="VAST_API_KEY", key=VAST_KEY)
    assert cost.returncode == 0, cost.stderr
    rows = [json.loads(line) for line in cost.stdout.splitlines()]
    assert [r["group"] for r in rows] == ["vastai", "total"]
    assert rows[0]["spent_usd"] > 0
    report = cli(tmp_path, "report", "--out", str(tmp_path / "report.html"), key_var="VAST_API_KEY", key=VAST_KEY)
    assert report.returncode == 0, report.stderr
    assert "vastai" in (tmp_path / "report.html").read_text()
    assert files_holding(tmp_path / "state", VAST_KEY) == []
    assert files_holding(tmp_path / "out", VAST_KEY) == []
    assert VAST_KEY not in (tmp_path / "report.html").read_text()
    assert VAST_KEY not in done.stdout + done.stderr


def test_an_interruptible_vast_seed_outbid_mid_run_is_preempted_and_succeeds_on_the_next(
        tmp_path: Path, vast: Any) -> None:
    batch = interruptible(write_batch(tmp_path, "vastai", vast.url, gpus=["A100-80G"], seeds=[1], first_steps=100,
                                      settings=vast.settings()), "A100-80G")
    proc = start(tmp_path, batch, "VAST_API_KEY", "test-key")
    try:
        seen = read_until(proc, "Progress")
        leased = [e for e in seen if e["type"] == "Leased"][-1]
        vast.outbid(leased["machine"]["id"])  # stopped: its processes killed, its disk kept
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill9(proc)
    assert proc.returncode == 0, err[-3000:]
    assert ended(out) == [("failed", "preempted"), ("succeeded", None)]
    assert vast.alive() == []  # the outbid instance destroyed (its disk would bill)
    assert len(vast.created) == 2
    assert all(b.get("price") for b in vast.created)  # both rented by bid


def test_a_killed_controller_s_vast_job_is_ended_by_its_watchdog_and_its_instance_by_the_sweep(
        tmp_path: Path, vast: Any) -> None:
    """Vast keeps no deadline of its own: the host watchdog stops the job, the sweep destroys it."""
    batch = write_batch(tmp_path, "vastai", vast.url, gpus=["A100-80G"], seeds=[1], steps=400, step_s=0.25,
                        settings=vast.settings())
    batch.write_text(batch.read_text().replace("lost_after_s = 10", "lost_after_s = 2"))
    proc = start(tmp_path, batch, "VAST_API_KEY", "test-key")
    seen = read_until(proc, "Progress")
    pid = [e for e in seen if e["type"] == "JobStarted"][-1]["pid"]
    machine = [e for e in seen if e["type"] == "Leased"][-1]["machine"]
    kill9(proc)
    work = list((vast.boxes.boxes[machine["id"]].home / ".actor-run" / "work").glob("*/*/*/*"))
    assert work, "the attempt's folder is on the machine"

    def stopped() -> bool:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        return not alive and not any(w.exists() for w in work)

    poll(stopped, 2 + 2 + 2 + 2 + 30, "the watchdog to stop the job and remove its folder", every=0.2)
    assert vast.alive() == [machine["name"]]  # the instance still bills: Vast would keep it
    swept = cli(tmp_path, "sweep", key_var="VAST_API_KEY")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert vast.alive() == []


def test_a_2_seed_shadeform_batch_with_provider_deadlines_and_a_spot_reclaim(tmp_path: Path, shadeform: Any) -> None:
    shadeform.token = SHADE_KEY
    batch = interruptible(write_batch(tmp_path, "shadeform", shadeform.url, gpus=["H100", "A100-80G"], seeds=[1, 2],
                                      first_steps=60, settings=shadeform.settings()), "H100")
    batch.write_text(batch.read_text().replace("[policy]\n", "[policy]\nbudget_usd = 50\n", 1))
    proc = start(tmp_path, batch, "SHADEFORM_API_KEY", SHADE_KEY)
    try:
        seen = read_until(proc, "Progress")
        leased = [e for e in seen if e["type"] == "Leased"][-1]
        shadeform.reclaim(leased["machine"]["id"])  # Shadeform takes its spot capacity back
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            kill9(proc)
    assert proc.returncode == 0, err[-3000:]
    evs = seen + events(out)  # what read_until took, and the rest
    outcomes = [(e["outcome"], e.get("failure")) for e in evs if e["type"] == "AttemptEnded"]
    assert outcomes.count(("failed", "preempted")) == 1
    assert outcomes.count(("succeeded", None)) == 2
    assert shadeform.alive() == []
    deadlines = {e["machine"]["name"]: e["machine"]["deadline"] for e in evs if e["type"] == "Leased"}
    assert len(deadlines) == 3
    assert shadeform.created[0]["rental_type"] == "spot"
    reserved = {round(e["usd"], 2) for e in evs if e["type"] == "Reserved"}
    for body in shadeform.created:
        threshold = datetime.datetime.fromisoformat(body["auto_delete"]["date_threshold"]).timestamp()
        assert abs(threshold - deadlines[body["name"]]) < 60, body
        # the batch has a budget: Shadeform also ends the machine once it cost what the attempt holds
        assert float(body["auto_delete"]["spend_threshold"]) in reserved, (body, reserved)
        assert f"actor-run-name={body['name']}" in body["tags"]
    cost = cli(tmp_path, "cost", "--by", "cloud", "--json", key_var="SHADEFORM_API_KEY", key=SHADE_KEY)
    assert cost.returncode == 0, cost.stderr
    assert [json.loads(line)["group"] for line in cost.stdout.splitlines()] == ["shadeform", "total"]
    for out_dir in ("state", "out"):
        assert files_holding(tmp_path / out_dir, SHADE_KEY) == []
    assert SHADE_KEY not in out + err
    assert time.time() < min(deadlines.values())  # nothing here waited for a deadline: each was set ahead


@pytest.mark.parametrize(("line", "want"), [
    ('cloud = "sim"\ngpu = "A100"\ninterruptible = true',
     "candidates[0].interruptible: sim sells no interruptible capacity here (clouds that do: shadeform, vastai)"),
    ('cloud = "vastai"\ngpu = "A100"\nmax_bid_usd = 0.5',
     "candidates[0].max_bid_usd: a bid is for a vastai candidate with interruptible = true"),
    ('cloud = "vastai"\ngpu = "A100"\ninterruptible = true\nmax_bid_usd = -1',
     "candidates[0].max_bid_usd"),
])
def test_interruptible_where_it_is_not_sold_is_bad_input(tmp_path: Path, line: str, want: str) -> None:
    batch = tmp_path / "bad.toml"
    batch.write_text(f'[job]\nname = "bad"\ncommand = "true"\nseeds = [1]\n\n[[candidates]]\n{line}\n')
    done = cli(tmp_path, "run", str(batch), "--out", str(tmp_path / "out"), key_var="VAST_API_KEY")
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert want in done.stderr
