"""A user's first real run (issue 25), through a real `actor-run` process against the fake
providers (as slow and untidy as the vendors: sshd some seconds after the API says ready, a stale
machine of ours already on the account, a no-stock answer between launch failures) and the sim."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.batch_kit import cli, events, kill9, start_run, write_batch
from fakes.keys import client_key
from fakes.providers import FAKES, serve


@pytest.fixture(params=sorted(FAKES))
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from serve(request.param, tmp_path)


@pytest.fixture
def runpod(tmp_path: Path) -> Iterator[Any]:
    yield from serve("runpod", tmp_path)


def run(tmp: Path, fake: Any, *, seeds: list[int], settings: dict[str, Any] | None = None,
        gpus: list[str] | None = None, **kw: Any) -> Any:
    batch = write_batch(tmp, fake.CLOUD, fake.url, gpus=gpus or list(fake.GPUS), seeds=seeds,
                        settings={**fake.settings(), **(settings or {})}, **kw)
    return cli(tmp, "run", str(batch), "--json", "--out", str(tmp / "out"), key_var=fake.KEY_VAR)


def stale_name() -> str:
    """A name by our rule, of a controller this ledger never knew, two hours past its deadline."""
    return f"ar-old-1-a0-0badc0de-d{int(time.time()) - 7200}"


# --- readiness --------------------------------------------------------------------------------------


def test_a_2_seed_batch_waits_for_sshd_that_opens_5_s_after_ready(tmp_path: Path, provider: Any) -> None:
    with provider.lock:
        provider.ssh_after_s = 5.0
    done = run(tmp_path, provider, seeds=[1, 2])
    assert done.returncode == 0, done.stderr[-3000:]
    evs = events(done.stdout)
    assert [e["outcome"] for e in evs if e["type"] == "AttemptEnded"] == ["succeeded"] * 2  # no attempt lost
    stages = [(e["seed"], e["stage"]) for e in evs if e["type"] == "LeaseStage"]
    assert sorted(stages) == [(1, "booting"), (1, "waiting for ssh"), (2, "booting"), (2, "waiting for ssh")]
    assert provider.alive() == []
    for seed in (1, 2):
        result = tmp_path / "out" / "latest" / "rented" / f"seed-{seed}" / "out" / "result.txt"
        assert result.read_text() == f"{seed} payload"


def test_status_shows_a_machine_waiting_for_ssh(tmp_path: Path, runpod: Any) -> None:
    with runpod.lock:
        runpod.ssh_after_s = 600.0  # its sshd opens when this test has seen the stage (open_now below)
    batch = write_batch(tmp_path, "runpod", runpod.url, gpus=["A100-80G"], seeds=[1], settings=runpod.settings())
    proc = start_run(tmp_path, batch, key_var=runpod.KEY_VAR)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the run's own end
            if '"LeaseStage"' in line and "waiting for ssh" in line:
                break
        shown = ""
        for _ in range(50):  # the ledger's writer commits in batches: a bounded wait for the row
            shown = cli(tmp_path, "status", key_var=runpod.KEY_VAR).stdout
            if "stage waiting for ssh" in shown:
                break
        assert "rented/seed-1" in shown
        assert "stage waiting for ssh" in shown, shown
        runpod.boxes.open_now()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            kill9(proc)
    assert runpod.alive() == []


# --- no stock never costs an attempt ------------------------------------------------------------------


def test_no_stock_first_then_launch_failures_get_every_attempt(tmp_path: Path, runpod: Any) -> None:
    with runpod.lock:
        runpod.launch_answers = ["no_stock", "fail", "fail", "fail"]
    # one place (the fake's H100s are in one data center): it refuses for stock, then its launches fail
    done = run(tmp_path, runpod, seeds=[1], attempts=3, settings={"launch_timeout_s": 20}, gpus=["H100"])
    assert done.returncode == 1, done.stderr[-3000:]
    evs = events(done.stdout)
    ended = [e["failure"] for e in evs if e["type"] == "AttemptEnded"]
    assert ended == ["no_capacity", "launch_failed", "launch_failed", "launch_failed"]
    started = {e["attempt"] for e in evs if e["type"] == "AttemptStarted"}
    retrying = [e["attempt"] for e in evs if e["type"] == "Retrying"]
    assert retrying == [2, 3]  # one for each retried attempt, and each of them ran
    assert set(retrying) <= started
    [job] = [e for e in evs if e["type"] == "JobEnded"]
    assert (job["failure"], job["attempts"]) == ("launch_failed", 3)  # no-stock walk step: no attempt
    assert runpod.alive() == []


# --- the sweep sees every cloud it can ------------------------------------------------------------


def test_a_stale_machine_of_ours_is_deleted_when_a_run_starts_on_a_fresh_ledger(tmp_path: Path,
                                                                                provider: Any) -> None:
    old = stale_name()
    provider.stale(old)
    assert provider.alive() == [old]
    done = run(tmp_path, provider, seeds=[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert provider.alive() == []
    assert old in [b[0] for b in provider.billed]


def test_sweep_on_a_fresh_ledger_asks_the_clouds_of_the_user_s_config(tmp_path: Path, provider: Any) -> None:
    old = stale_name()
    provider.stale(old)
    # timeout_s: the fake checks its first request against the vendor's document, which takes long
    # on a busy machine (the first call of a test process loads it)
    settings = {"api_url": provider.url, "ssh_key": str(client_key(tmp_path / "keys")), "timeout_s": 120,
                **provider.settings()}
    config = tmp_path / "config.toml"
    config.write_text(f"[clouds.{provider.CLOUD}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    dry = cli(tmp_path, "sweep", "--dry-run", "--config", str(config), key_var=provider.KEY_VAR)
    assert dry.returncode == 0, dry.stderr
    assert old in dry.stdout
    assert provider.alive() == [old]
    swept = cli(tmp_path, "sweep", "--config", str(config), key_var=provider.KEY_VAR)
    assert swept.returncode == 0, swept.stderr
    assert provider.alive() == []
    assert f"{old} " in swept.stdout
    assert "deleted" in swept.stdout


def test_sweep_on_a_fresh_ledger_asks_the_clouds_a_batch_names(tmp_path: Path, runpod: Any) -> None:
    old = stale_name()
    runpod.stale(old)
    batch = write_batch(tmp_path, "runpod", runpod.url, gpus=["A100-80G"], seeds=[1], settings=runpod.settings())
    swept = cli(tmp_path, "sweep", "--batch", str(batch), key_var=runpod.KEY_VAR)
    assert swept.returncode == 0, swept.stderr
    assert runpod.alive() == []
    assert f"{old} " in swept.stdout
    assert [c for c in runpod.calls if c[0] == "POST"] == []  # a sweep makes nothing


# --- a cloud is its settings ----------------------------------------------------------------------------


def sim_batch(tmp: Path, region: str) -> Path:
    path = tmp / f"sim-{region}.toml"
    path.write_text(f"""
[job]
name = "where"
command = "true"
seeds = [1]

[policy]
poll_s = 0.2
backoff_s = 0.05

[[candidates]]
cloud = "sim"
gpu = "A100"
regions = ["{region}"]

[clouds.sim]
launch_latency_s = 0.05
delete_latency_s = 0.0

[[clouds.sim.regions]]
name = "{region}"
gpus = {{ A100 = {{ stock = 2, hourly_usd = 1.0 }} }}
""")
    return path


def test_two_runs_of_one_batch_each_lease_with_their_own_settings(tmp_path: Path, runpod: Any) -> None:
    places = []
    for region in ("moon", "mars"):
        done = cli(tmp_path, "run", str(sim_batch(tmp_path, region)), "--json", "--out", str(tmp_path / "out"),
                   key_var="UNUSED")
        assert done.returncode == 0, done.stderr[-3000:]
        places += [e["offer"]["region"] for e in events(done.stdout) if e["type"] == "AttemptStarted"]
    assert places == ["moon", "mars"]
    for image in ("image-A", "image-B"):
        done = run(tmp_path, runpod, seeds=[1], settings={"image": image})
        assert done.returncode == 0, done.stderr[-3000:]
    assert [b["image"] for b in runpod.created] == ["image-A", "image-B"]
    assert runpod.alive() == []


# --- names checked before anything starts --------------------------------------------------------------


@pytest.mark.parametrize(("field", "line", "want"), [
    ("gpu", 'gpu = "H1000"', "candidates[0].gpu: unknown GPU for sim 'H1000' (did you mean 'H100'"),
    ("regions", 'gpu = "A100"\nregions = ["us-esat"]',
     "candidates[0].regions[0]: unknown region for sim 'us-esat' (did you mean 'us-east'"),
])
def test_a_typo_in_a_gpu_or_region_is_bad_input(tmp_path: Path, field: str, line: str, want: str) -> None:
    batch = tmp_path / "typo.toml"
    batch.write_text(f'[job]\nname = "typo"\ncommand = "true"\nseeds = [1]\n\n[[candidates]]\ncloud = "sim"\n{line}\n')
    done = cli(tmp_path, "run", str(batch), "--out", str(tmp_path / "out"), key_var="UNUSED")
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert want in done.stderr
    assert not (tmp_path / "out" / "typo").exists()


def test_a_region_the_rented_cloud_does_not_have_is_bad_input(tmp_path: Path, runpod: Any) -> None:
    batch = write_batch(tmp_path, "runpod", runpod.url, gpus=["A100-80G"], seeds=[1])
    batch.write_text(batch.read_text().replace('gpu = "A100-80G"\n', 'gpu = "A100-80G"\nregions = ["EU-R0-1"]\n'))
    done = cli(tmp_path, "run", str(batch), "--out", str(tmp_path / "out"), key_var=runpod.KEY_VAR)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "candidates[0].regions[0]: unknown region for runpod 'EU-R0-1' (did you mean 'EU-RO-1'" in done.stderr
    assert [c for c in runpod.calls if c[0] == "POST"] == []  # listed by the start-up sweep, nothing made


def test_a_missing_lambda_file_system_is_bad_input(tmp_path: Path) -> None:
    fake = FAKES["lambda"](tmp_path / "fake").start()
    try:
        fake.file_systems["shared"] = "us-west-1"
        done = run(tmp_path, fake, seeds=[1], settings={"file_system": "sahred"})
        assert done.returncode == 2, done.stdout + done.stderr
        assert "clouds.lambda.file_system: no file system named 'sahred'" in done.stderr
        assert [c for c in fake.calls if c[1] == "/api/v1/instance-operations/launch"] == []
    finally:
        fake.stop()
    assert fake.violations == []
