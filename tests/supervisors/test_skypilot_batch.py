"""Whole batches on SkyPilot clusters: the `actor-run` CLI against a fake `sky` (tests/fake_sky.py)
whose clusters are logins on a real sshd and whose instances live in a moto EC2 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_sky import FakeSky, aws_env, power_off
from moto_ec2 import MotoEc2
from sshd import Sshd

CLI = [sys.executable, "-m", "actor_run"]
REGIONS = ["us-east-1", "us-west-2"]

JOB = r'''
import json, os, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
steps = int(os.environ.get("STEPS", "3"))
for step in range(steps):
    time.sleep(0.2)
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n"); progress.flush()
    print("step", step, flush=True)
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "result.txt"), "w").write(os.environ["ACTOR_RUN_SEED"])
'''


@pytest.fixture(scope="module")
def moto_server() -> Iterator[MotoEc2]:
    with MotoEc2() as server:
        yield server


@pytest.fixture
def ec2(moto_server: MotoEc2) -> MotoEc2:
    moto_server.reset()
    return moto_server


@pytest.fixture
def fake(tmp_path: Path, sshd: Sshd, ec2: MotoEc2) -> Iterator[FakeSky]:
    yield FakeSky(tmp_path / "sky", address=sshd.address, ec2_endpoint=ec2.endpoint)
    power_off(tmp_path / "root")  # its instances are terminated: nothing runs on them any more


def batch(tmp: Path, sshd: Sshd, fake: FakeSky, *, seeds: list[int], steps: int = 3) -> Path:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "job.py").write_text(JOB)
    path = tmp / "sky.toml"
    path.write_text(f"""
[job]
name = "sky-batch"
command = "python3 job.py"
code = "code"
seeds = {seeds}
timeout_s = 300
env = {{ STEPS = "{steps}" }}
public_env = ["STEPS"]

[policy]
max_attempts = 2
concurrency = {len(seeds)}
setup_grace_s = 120
stall_after_s = 60
poll_s = 0.2
lost_after_s = 60

[[candidates]]
cloud = "skypilot"
gpu = "A10G"
regions = ["us-east-1"]

[[candidates]]
cloud = "skypilot"
gpu = "A10G"
regions = ["us-west-2"]

[clouds.skypilot]
sky = "{fake.command}"
infra = "aws/us-east-1"
regions = {json.dumps(REGIONS)}
ssh_key = "{sshd.user_key}"
ssh_user = "{sshd.user}"
ssh_port = {sshd.port}
root = "{tmp / 'root'}"
ec2_endpoint = "{fake.ec2_endpoint}"
poll_s = 0.2
cli_timeout_s = 15
deadline_command = "echo {{minutes}} >> {tmp / 'shutdowns'}"
""")
    return path


def cli(tmp: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--state-dir", str(tmp / "state")], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp, env={**os.environ, **aws_env()})


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def machine_states(tmp: Path) -> list[str]:
    status = cli(tmp, "status", "--json")
    return sorted(d["state"] for d in map(json.loads, status.stdout.splitlines()) if d["kind"] == "machine")


def live_instances(ec2: MotoEc2) -> list[dict]:
    return [i for r in REGIONS for i in ec2.live(region=r)]


def test_a_batch_walks_past_a_region_without_capacity_and_leaves_nothing(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    fake.set_faults(unavailable=["us-east-1"])
    path = batch(tmp_path, sshd, fake, seeds=[1, 2])
    done = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    for seed in (1, 2):
        assert (tmp_path / "out" / "sky-batch" / f"seed-{seed}" / "out" / "result.txt").read_text() == str(seed)
    evs = events(done.stdout)
    # the first candidate refused (no capacity), the second placed both: one attempt, one placement each
    assert sorted(e["failure"] for e in evs if e["type"] == "LeaseFailed") == ["no_capacity", "no_capacity"]
    leased = [e for e in evs if e["type"] == "Leased"]
    assert sorted(e["machine"]["region"] for e in leased) == ["us-west-2", "us-west-2"]
    assert {e["machine"]["hourly_usd"] for e in leased} == {1.006}  # SkyPilot's price for an A10G
    ended = [e for e in evs if e["type"] == "JobEnded"]
    assert [e["outcome"] for e in ended] == ["succeeded", "succeeded"]
    assert all(0 < e["usd"] < 1.006 for e in ended)  # seconds of a $1.006/h machine
    # the deadline went onto each machine: its shutdown scheduled, its instances set to terminate
    assert len((tmp_path / "shutdowns").read_text().split()) == 2
    assert {ec2.shutdown_behavior(i["InstanceId"], "us-west-2") for i in ec2.instances(region="us-west-2")} == {
        "terminate"}
    # nothing left: no cluster, no live instance, every ledger row closed
    assert fake.clusters() == {}
    assert live_instances(ec2) == []
    assert machine_states(tmp_path) == ["deleted"] * 4  # two refused in us-east-1, two used in us-west-2


def test_a_killed_controller_is_swept_to_zero_clusters_and_zero_instances(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    path = batch(tmp_path, sshd, fake, seeds=[1], steps=400)
    proc = subprocess.Popen([*CLI, "run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, **aws_env()})
    assert proc.stdout is not None
    for line in proc.stdout:
        if '"type":"Progress"' in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert len(fake.clusters()) == 1
    assert len(live_instances(ec2)) == 1
    fake.forget(next(iter(fake.clusters())))  # and SkyPilot lost its record: only EC2's tag finds it now
    swept = cli(tmp_path, "sweep")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert " deleted " in swept.stdout, swept.stdout + swept.stderr
    assert fake.clusters() == {}
    assert live_instances(ec2) == []


def test_when_sky_down_fails_the_ledger_row_closes_on_ec2s_proof(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    fake.set_faults(down="fail")
    path = batch(tmp_path, sshd, fake, seeds=[1], steps=1)
    done = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(fake.clusters()) == 1  # SkyPilot could not tear it down and still lists it
    assert live_instances(ec2) == []  # EC2 terminated its instance
    assert [i["State"]["Name"] for i in ec2.instances(region="us-east-1")] == ["terminated"]
    assert machine_states(tmp_path) == ["deleted"]  # its row closed on EC2's proof
