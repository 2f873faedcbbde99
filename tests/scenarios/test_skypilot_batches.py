"""Whole batches on SkyPilot clusters: the `actor-run` CLI against a fake `sky` (tests/fakes/sky.py)
whose clusters are logins on a real sshd and whose instances live in a moto EC2 server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from fakes.machines import Box, gpu_tools
from fakes.moto_ec2 import MotoEc2
from fakes.moto_server import MotoServer
from fakes.sky import FakeSky, aws_env, power_off
from support.cli_inproc import CLI, run_cli
from support.sshd import Sshd

from actor_run.protocols.names import parse_name

REGIONS = ["us-east-1", "us-west-2"]

JOB = r'''
import json, os, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
steps = int(os.environ.get("STEPS", "3"))
for step in range(steps):
    time.sleep(0.2)  # the job's own work: a step takes this long
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n"); progress.flush()
    print("step", step, flush=True)
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "result.txt"), "w").write(os.environ["ACTOR_RUN_SEED"])
'''


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """The clusters' head nodes: a real sshd whose logins have the GPU the cluster was launched with
    (a g5's one A10G) in nvidia-smi, as SkyPilot's GPU images do: the lease checks it before the job."""
    box = Box(tmp_path / "sshd", "", {}, tools=gpu_tools("NVIDIA A10G", 1))
    box.authorized_keys.write_text(box.user_key.with_name(box.user_key.name + ".pub").read_text())
    try:
        yield box
    finally:
        box.stop()


@pytest.fixture(scope="module")
def moto_server(moto: MotoServer) -> Iterator[MotoEc2]:
    with MotoEc2(moto) as server:
        yield server


@pytest.fixture
def ec2(moto_server: MotoEc2) -> MotoEc2:
    moto_server.reset()
    return moto_server


MINUTE_S = 1.0  # a minute of the fake skylet's autostop, in seconds


@pytest.fixture
def fake(tmp_path: Path, sshd: Sshd, ec2: MotoEc2) -> Iterator[FakeSky]:
    fake = FakeSky(tmp_path / "sky", address=sshd.address, ec2_endpoint=ec2.endpoint, root=tmp_path / "root",
                   sshd_pidfile=sshd.dir / "sshd.pid", minute_s=MINUTE_S)
    yield fake
    fake.stop()  # its skylets and their jobs
    power_off(tmp_path / "root")  # its instances are terminated: nothing runs on them any more
    assert processes_in(tmp_path / "root") == []  # not even a job started detached on a cluster


def batch(tmp: Path, sshd: Sshd, fake: FakeSky, *, seeds: list[int], steps: int = 3, timeout_s: float = 300,
          setup_grace_s: float = 120, policy: str = "", sky: str = "") -> Path:
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
timeout_s = {timeout_s}
env = {{ STEPS = "{steps}" }}
public_env = ["STEPS"]

[policy]
max_attempts = 2
concurrency = {len(seeds)}
setup_grace_s = {setup_grace_s}
stall_after_s = 60
{policy}
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
{sky}
""")
    return path


def cli(tmp: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=timeout, cwd=tmp,
                   env={**os.environ, **aws_env()})


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
        assert (tmp_path / "out" / "latest" / "sky-batch" / f"seed-{seed}" / "out" / "result.txt").read_text() == (
            str(seed))
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
    # `actor-run ssh` (issue 29.4) on the running job: SkyPilot's cluster, SkyPilot's login; it says so
    shell = run_cli(["ssh", "sky-batch/1", "--state-dir", str(tmp_path / "state"), "--", "pwd"],
                           timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL,
                           env={**os.environ, **aws_env()})
    assert (shell.returncode, shell.stdout) == (2, "")
    [cluster] = fake.clusters()
    assert re.fullmatch(r"actor-run: ssh: skypilot: actor-run opens no shell on a SkyPilot cluster \(SkyPilot "
                        rf"holds its login: its key and host entry\); use SkyPilot's: ssh {cluster}, then cd \S+\n",
                        shell.stderr), shell.stderr
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


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    """Poll a condition on the fake's state (another process's) until it holds, at most `timeout` s."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        threading.Event().wait(0.2)
    return True


def test_a_job_longer_than_skypilots_idle_time_finishes_on_the_same_cluster(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    """The fake's skylet autostops a cluster idle for one (scaled) minute, counting only its job
    queue and SSH sessions with a terminal: our job runs several such minutes over SSH, and the
    cluster's own job (a sleep until the deadline) keeps it from tearing itself down under us."""
    path = batch(tmp_path, sshd, fake, seeds=[1], steps=int(6 * MINUTE_S / 0.2), sky="idle_minutes = 1")
    done = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    evs = events(done.stdout)
    assert len([e for e in evs if e["type"] == "Leased"]) == 1  # one cluster, never replaced
    assert [e["outcome"] for e in evs if e["type"] == "JobEnded"] == ["succeeded"]
    assert fake.autodowns() == []  # skylet never took it: our delete did, at the end
    assert fake.clusters() == {}
    assert live_instances(ec2) == []


def test_a_cluster_whose_controller_was_killed_deletes_itself_by_its_deadline_plus_the_idle_minutes(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    """kill -9 of the controller, no sweep: the cluster lives while its lease does (its own job
    keeps skylet from autostopping it), then SkyPilot's autodown deletes it `idle_minutes` after
    the deadline (the fake's skylet, one minute = MINUTE_S)."""
    idle = 2
    path = batch(tmp_path, sshd, fake, seeds=[1], steps=2000, timeout_s=6, setup_grace_s=10,
                 policy="deadline_margin_s = 0", sky=f"idle_minutes = {idle}")
    proc = subprocess.Popen([*CLI, "run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, **aws_env()})
    assert proc.stdout is not None
    for line in proc.stdout:
        if '"type":"Progress"' in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    [name] = fake.clusters()
    parsed = parse_name(name)
    assert parsed is not None
    deadline = float(parsed.deadline)
    latest = deadline + (idle + 2) * MINUTE_S + 30  # skylet checks once a minute; 30 s for a loaded machine
    assert wait_until(lambda: not fake.clusters(), latest - time.time() + 5), "the cluster outlived its bound"
    [down] = fake.autodowns()
    assert down["name"] == name
    assert deadline <= down["at"] <= latest  # not before the lease's end, and soon after it
    assert live_instances(ec2) == []
    # and what ran on it went with it, as a terminated VM's processes do: the job (`python3 job.py`,
    # 2000 steps, started detached in its code folder under the root) does not run on
    assert processes_in(tmp_path / "root") == []


def processes_in(folder: Path) -> list[str]:
    """The live processes working in `folder` (their cwd under it), as `pid: command line`."""
    found = []
    for p in psutil.process_iter(["cwd", "cmdline"]):
        cwd = p.info["cwd"] or ""
        if cwd == str(folder) or cwd.startswith(f"{folder}/"):
            found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])}")
    return found
