"""The machine a job needs (issue 42), through `actor-run` as a user runs it: 8-GPU shapes on the sim and
on each rented fake (at the machine's price; the job sees how many GPUs it has), a place without an
image whose CUDA runs the GPU class skipped before any create, and a machine that fails its check
before the job (nvidia-smi shows another class or too few, its clock is off) deleted, the job going on
to the next place. The fakes serve real HTTP held to each vendor's OpenAPI document; their machines
are real sshd logins whose `nvidia-smi` and `date` the fake chooses (fakes/machines.py `gpu_tools`)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.batch_kit import JOB, cli, events, write_batch
from fakes.lambdacloud import IMAGES as LAMBDA_IMAGES
from fakes.providers import serve
from support.cli_inproc import run_cli

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}

# the job also says what it was given: how many GPUs, of which class
GPU_JOB = JOB + r'''
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "gpus.txt"), "w").write(
    os.environ["ACTOR_RUN_GPUS"] + " " + os.environ["ACTOR_RUN_GPU"])
'''

# the machine each fake leases for `A100:8`: what its create names, and the machine's price per hour
EIGHT = {
    "runpod": (lambda body: (body["gpu"]["id"], body["gpu"]["count"]) == ("NVIDIA A100-SXM4-80GB", 8), 1.89 * 8),
    "hyperstack": (lambda body: body["flavor_name"] == "n3-A100x8", 1.35 * 8 + 0.00672),
    "lambda": (lambda body: body["instance_type_name"] == "gpu_8x_a100", 10.32),
}


@pytest.fixture(params=sorted(EIGHT))
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from serve(request.param, tmp_path)


@pytest.fixture
def runpod(tmp_path: Path) -> Iterator[Any]:
    yield from serve("runpod", tmp_path)


@pytest.fixture
def hyperstack(tmp_path: Path) -> Iterator[Any]:
    yield from serve("hyperstack", tmp_path)


def rented_run(tmp: Path, fake: Any, gpus: list[str], *, attempts: int = 3, extra: str = "") -> Any:
    batch = write_batch(tmp, fake.CLOUD, fake.url, gpus=gpus, seeds=[1], settings=fake.settings(), attempts=attempts)
    (tmp / "code" / "job.py").write_text(GPU_JOB)
    if extra:
        batch.write_text(batch.read_text() + extra)
    return cli(tmp, "run", str(batch), "--json", "--out", str(tmp / "out"), key_var=fake.KEY_VAR)


def seed_out(tmp: Path, name: str = "rented") -> Path:
    return tmp / "out" / "latest" / name / "seed-1" / "out"


def ended(evs: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["outcome"], e.get("failure")) for e in evs if e["type"] == "AttemptEnded"]


def test_an_8_gpu_batch_on_each_rented_fake_leases_an_8_gpu_machine_at_its_price(tmp_path: Path,
                                                                                   provider: Any) -> None:
    done = rented_run(tmp_path, provider, ["A100:8"])
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    assert ended(evs) == [("succeeded", None)]
    names_it, price = EIGHT[provider.CLOUD]
    assert len(provider.created) == 1, provider.created
    assert names_it(provider.created[0]), provider.created
    leased = next(e["machine"] for e in evs if e["type"] == "Leased")
    assert leased["gpu"] == "A100:8"
    assert leased["hourly_usd"] == pytest.approx(price, abs=1e-3)  # the machine's price, not one GPU's
    assert (seed_out(tmp_path) / "gpus.txt").read_text() == "8 A100"
    assert provider.alive() == []


SIM_BATCH = """\
[job]
name = "shape"
command = "sh job.sh"
code = "code"
seeds = [1]

[policy]
poll_s = 0.1
backoff_s = 0.0

[clouds.sim]
launch_latency_s = 0.05
delete_latency_s = 0.01

[[candidates]]
cloud = "sim"
gpu = "A100:8"
"""


def test_an_8_gpu_batch_on_the_sim_leases_the_8_gpu_shape_at_its_own_price(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.sh").write_text('printf "%s %s" "$ACTOR_RUN_GPUS" "$ACTOR_RUN_GPU" > "$ACTOR_RUN_OUT/gpus.txt"\n')
    (tmp_path / "b.toml").write_text(SIM_BATCH)
    done = run_cli(["run", str(tmp_path / "b.toml"), "--json", "--state-dir", str(tmp_path / "state"),
                    "--out", str(tmp_path / "out")], timeout=240, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    leased = next(e["machine"] for e in events(done.stdout) if e["type"] == "Leased")
    assert (leased["gpu"], leased["hourly_usd"], leased["region"]) == ("A100:8", 14.4, "us-east")
    assert (seed_out(tmp_path, "shape") / "gpus.txt").read_text() == "8 A100"


def test_offers_and_plan_print_shapes_images_and_the_machines_price(tmp_path: Path, runpod: Any) -> None:
    done = run_cli(["offers", "--gpu", "H100:8", "--cloud", "sim", "--state-dir", str(tmp_path / "state")],
                   timeout=120, env=ENV, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert rows == [["sim", "us-east", "H100:8", "23.2000", "1", "-", "-", "-"]]  # no kind, interruptible, image
    batch = write_batch(tmp_path, "runpod", runpod.url, gpus=["A100:8"], seeds=[1], settings=runpod.settings())
    planned = cli(tmp_path, "plan", str(batch), key_var=runpod.KEY_VAR)
    assert planned.returncode == 0, planned.stderr
    line = next(x for x in planned.stdout.splitlines() if "EU-RO-1" in x)
    assert "A100:8" in line
    assert "$15.12/h" in line
    assert "image runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404" in line
    assert runpod.created == []  # a plan leases nothing


def test_a_runpod_data_center_whose_hosts_lack_the_images_cuda_is_skipped_before_any_create(
        tmp_path: Path, runpod: Any) -> None:
    # CA-MTL-1's hosts run CUDA 12.2; the image (cu1281) needs 12.8: only EU-RO-1 qualifies
    extra = 'regions = ["CA-MTL-1", "EU-RO-1"]\n'
    batch = write_batch(tmp_path, "runpod", runpod.url, gpus=["A100"], seeds=[1], settings=runpod.settings())
    (tmp_path / "code" / "job.py").write_text(GPU_JOB)
    batch.write_text(batch.read_text().replace('gpu = "A100"\n', 'gpu = "A100"\n' + extra))
    done = cli(tmp_path, "run", str(batch), "--json", "--out", str(tmp_path / "out"), key_var=runpod.KEY_VAR)
    assert done.returncode == 0, done.stderr
    assert ended(events(done.stdout)) == [("succeeded", None)]  # one attempt: the skip cost none
    assert [b["dataCenterIds"] for b in runpod.created] == [["EU-RO-1"]]
    assert runpod.created[0]["gpu"]["minCudaVersion"] == "12.8"


def test_a_hyperstack_region_without_an_image_for_blackwell_is_skipped_and_the_image_is_chosen_by_cuda(
        tmp_path: Path, hyperstack: Any) -> None:
    # B200 needs CUDA 12.8; CANADA-1 (its only region) has images up to 12.2: the candidate has no offer
    done = rented_run(tmp_path, hyperstack, ["B200", "A100-80G"])
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    assert ended(evs) == [("succeeded", None)]
    # no B200 was made; the A100 in CANADA-1 boots that region's image with a CUDA (not the bare Ubuntu)
    assert [(b["flavor_name"], b["image_name"]) for b in hyperstack.created] == [
        ("n3-A100x1-ca", "Ubuntu Server 22.04 LTS R535 CUDA 12.2")]
    plan = cli(tmp_path, "plan", str(tmp_path / "hyperstack.toml"), key_var=hyperstack.KEY_VAR)
    assert plan.returncode == 0, plan.stderr
    b200 = plan.stdout.split("candidate 0:")[1].split("candidate 1:")[0]
    assert "nothing in stock now" in b200  # CANADA-1 has its stock, and no image it can run
    norway = next(x for x in plan.stdout.splitlines() if "NORWAY-1" in x and "A100-80G" in x)
    assert "image Ubuntu Server 24.04 LTS R570 CUDA 12.8" in norway  # each region its own newest CUDA


@pytest.mark.parametrize(("fault", "skew", "says"), [
    ("wrong", 0.0, "nvidia-smi lists 0 A100-80Gs, 1 asked (it lists: 1 x NVIDIA GeForce RTX 4090)"),
    ("few", 0.0, "nvidia-smi lists 7 A100-80Gs, 8 asked"),
    ("none", 0.0, "nvidia-smi sees no NVIDIA GPU"),
    ("", 300.0, "s ahead of the controller's (at most 60 s)"),
])
def test_a_machine_that_fails_its_check_is_deleted_unused_and_the_job_succeeds_on_the_next(
        tmp_path: Path, runpod: Any, fault: str, skew: float, says: str) -> None:
    runpod.smi_next = [fault]
    runpod.skew_next = [skew]
    gpu = "A100-80G:8" if fault == "few" else "A100-80G"
    done = rented_run(tmp_path, runpod, [gpu])
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    assert ended(evs) == [("failed", "launch_failed"), ("succeeded", None)]
    failed = next(e for e in evs if e["type"] == "LeaseFailed")
    assert says in failed["detail"]
    assert "before the job" in failed["detail"]
    # nothing went to the refused machine: no upload, no job
    assert not [e for e in evs if e["type"] in ("Uploaded", "JobStarted") and e["attempt"] == 0]
    assert runpod.alive() == []
    assert len(runpod.billed) == 2  # the refused machine was deleted, and so was the one that ran


def test_check_gpu_false_keeps_only_the_clock_check(tmp_path: Path, runpod: Any) -> None:
    runpod.smi_next = ["none"]  # an image without nvidia-smi's driver
    done = rented_run(tmp_path, runpod, ["A100-80G"], extra="check_gpu = false\n")
    assert done.returncode == 0, done.stderr
    assert ended(events(done.stdout)) == [("succeeded", None)]


def test_a_gpu_count_key_is_refused_with_a_hint_and_a_bad_shape_names_the_field(tmp_path: Path) -> None:
    for candidate, field, hint in (('gpu = "A100"\ngpu_count = 8', "candidates[0].gpu_count", 'gpu = "H100:8"'),
                                   ('gpu = "A100:0"', "candidates[0].gpu", "<GPU>:<count>")):
        (tmp_path / "b.toml").write_text(textwrap.dedent("""\
            [job]
            name = "bad"
            command = "true"
            seeds = [1]
            [[candidates]]
            cloud = "sim"
            """) + candidate + "\n")
        done = run_cli(["run", str(tmp_path / "b.toml"), "--state-dir", str(tmp_path / "state")], timeout=60,
                       env=ENV, cwd=tmp_path)
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1
        assert field in done.stderr
        assert hint in done.stderr


@pytest.fixture
def lambda_fake(tmp_path: Path) -> Iterator[Any]:
    yield from serve("lambda", tmp_path)


def test_lambda_boots_each_regions_image_by_cuda_and_a_region_without_one_is_skipped_before_any_create(
        tmp_path: Path, lambda_fake: Any) -> None:
    # B200 needs CUDA 12.8; us-west-1 lists images up to 12.2: the B200 candidate (held there) has no offer
    batch = write_batch(tmp_path, "lambda", lambda_fake.url, gpus=["B200", "A100-80G"], seeds=[1],
                        settings=lambda_fake.settings())
    (tmp_path / "code" / "job.py").write_text(GPU_JOB)
    batch.write_text(batch.read_text().replace('gpu = "B200"\n', 'gpu = "B200"\nregions = ["us-west-1"]\n'))
    done = cli(tmp_path, "run", str(batch), "--json", "--out", str(tmp_path / "out"), key_var=lambda_fake.KEY_VAR)
    assert done.returncode == 0, done.stderr
    assert ended(events(done.stdout)) == [("succeeded", None)]  # the skip cost no attempt
    # no B200 was asked for; the A100 in us-east-1 boots that region's newest CUDA image, by its id
    newest = next(i for i, n, *_ in LAMBDA_IMAGES["us-east-1"] if n == "lambda-stack-24-04")
    assert [(b["instance_type_name"], b["region_name"], b["image"]) for b in lambda_fake.created] == [
        ("gpu_1x_a100_sxm4_80gb", "us-east-1", {"id": newest})]
    plan = cli(tmp_path, "plan", str(batch), key_var=lambda_fake.KEY_VAR)
    assert plan.returncode == 0, plan.stderr
    b200 = plan.stdout.split("candidate 0:")[1].split("candidate 1:")[0]
    assert "nothing in stock now" in b200  # us-west-1 has B200 stock, and no image B200 can run
    assert "passed over: us-west-1: no image with CUDA 12.8 or newer for B200" in b200  # and says why
    lines = plan.stdout.splitlines()
    assert "image lambda-stack-24-04" in next(x for x in lines if "us-east-1" in x and "A100-80G" in x)
    assert "image lambda-stack-22-04" in next(x for x in lines if "us-west-1" in x and "A100-80G" in x)


def test_a_users_lambda_image_wins_over_the_newest_cuda(tmp_path: Path, lambda_fake: Any) -> None:
    done = rented_run(tmp_path, lambda_fake, ["A100-80G"], extra='image = "lambda-stack-22-04"\n')
    assert done.returncode == 0, done.stderr
    # a name the region lists is sent as its id: the user's choice, not the newest CUDA
    chosen = next(i for i, n, *_ in LAMBDA_IMAGES["us-east-1"] if n == "lambda-stack-22-04")
    assert [b["image"] for b in lambda_fake.created] == [{"id": chosen}]
