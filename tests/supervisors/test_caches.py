"""Caches that outlive an attempt (issue 42), through `actor-run` against the RunPod fake (network
volumes held to RunPod's OpenAPI document; pods that are real sshd logins which see their volume at
the cache's mount): the second attempt finds what the first wrote, `sweep` lists the volume and
`sweep --caches` deletes it, `cost` shows its storage; a place that cannot host it starts cold, or
with `required` is skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.batch_kit import cli, events, write_batch
from fakes.providers import serve

# a job's first lines: without a cache it says so and ends
NO_CACHE_ENDS = r'''
import os
cache = os.environ.get("ACTOR_RUN_CACHE", "")
out = os.environ["ACTOR_RUN_OUT"]
if not cache:
    open(os.path.join(out, "found.txt"), "w").write("no cache")
    raise SystemExit(0)
'''

CACHE_JOB = NO_CACHE_ENDS + r'''import json
weights = os.path.join(cache, "weights.bin")
if os.environ["ACTOR_RUN_ATTEMPT"] == "0":  # the first attempt fills the cache, then asks for another
    open(weights, "w").write("weights from attempt 0")
    with open(os.environ["ACTOR_RUN_PROGRESS"], "a") as f:
        f.write(json.dumps({"retriable": True, "reason": "a second attempt, to read the cache"}) + "\n")
    raise SystemExit(1)
open(os.path.join(out, "found.txt"), "w").write(open(weights).read())
'''


@pytest.fixture
def runpod(tmp_path: Path) -> Iterator[Any]:
    yield from serve("runpod", tmp_path)


def cache_batch(tmp: Path, fake: Any, *, required: bool = False) -> Path:
    batch = write_batch(tmp, "runpod", fake.url, gpus=["A100-80G"], seeds=[1], settings=fake.settings(), attempts=2)
    (tmp / "code" / "job.py").write_text(CACHE_JOB)
    mount = tmp / "mnt" / "cache"
    cache = (f'regions = ["EU-RO-1"]\ncache = {{ name = "weights", size_gb = 20, mount = "{mount}", '
             f'required = {str(required).lower()} }}\n')
    text = batch.read_text().replace('gpu = "A100-80G"\n', 'gpu = "A100-80G"\n' + cache)
    batch.write_text(text.replace("[policy]\n", "[policy]\ncapacity_wait_s = 0\n"))  # no stock: fail at once
    return batch


def found(tmp: Path) -> str:
    return (tmp / "out" / "latest" / "rented" / "seed-1" / "out" / "found.txt").read_text()


def test_the_second_attempt_finds_what_the_first_wrote_and_sweep_and_cost_show_the_volume(
        tmp_path: Path, runpod: Any) -> None:
    batch = cache_batch(tmp_path, runpod)
    done = cli(tmp_path, "run", str(batch), "--json", "--out", str(tmp_path / "out"), key_var=runpod.KEY_VAR)
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    assert [(e["outcome"], e.get("failure")) for e in evs if e["type"] == "AttemptEnded"] == [
        ("failed", "retriable"), ("succeeded", None)]
    assert found(tmp_path) == "weights from attempt 0"
    opened = [(e["attempt"], e["cache"], e["created"], e["cold"]) for e in evs if e["type"] == "CacheOpened"]
    assert opened == [(0, "ar-cache-weights", True, False), (1, "ar-cache-weights", False, False)]
    (volume,) = runpod.volumes.values()  # one volume, made once, kept by the run
    assert (volume["name"], volume["dataCenter"], volume["size"]) == ("ar-cache-weights", "EU-RO-1", 20)
    assert [b["mounts"]["network"][0]["volumeId"] for b in runpod.created] == [volume["id"]] * 2
    assert runpod.alive() == []

    swept = cli(tmp_path, "sweep", key_var=runpod.KEY_VAR)
    assert swept.returncode == 0, swept.stderr
    line = next(x for x in swept.stdout.splitlines() if "ar-cache-weights" in x)
    assert volume["id"] in line
    assert "20 GB" in line
    assert "kept" in line
    assert runpod.volumes  # a plain sweep keeps it

    cost = cli(tmp_path, "cost", key_var=runpod.KEY_VAR)
    assert cost.returncode == 0, cost.stderr
    assert "cache storage" in cost.stdout
    assert f"ar-cache-weights on runpod EU-RO-1 ({volume['id']}): 20 GB" in cost.stdout

    gone = cli(tmp_path, "sweep", "--caches", key_var=runpod.KEY_VAR)
    assert gone.returncode == 0, gone.stderr
    assert "deleted" in next(x for x in gone.stdout.splitlines() if "ar-cache-weights" in x)
    assert runpod.volumes == {}


def test_a_place_that_cannot_host_the_cache_starts_cold_and_says_so(tmp_path: Path, runpod: Any) -> None:
    runpod.volume_dcs = set()
    done = cli(tmp_path, "run", str(cache_batch(tmp_path, runpod)), "--json", "--out", str(tmp_path / "out"),
               key_var=runpod.KEY_VAR)
    assert done.returncode == 0, done.stderr
    cold = [e for e in events(done.stdout) if e["type"] == "CacheOpened"]
    assert [e["cold"] for e in cold] == [True]
    assert "a cold start" in cold[0]["detail"]
    assert found(tmp_path) == "no cache"
    assert "mounts" not in runpod.created[0]


def test_a_required_cache_skips_a_place_that_cannot_host_it_before_any_create(tmp_path: Path, runpod: Any) -> None:
    runpod.volume_dcs = set()
    done = cli(tmp_path, "run", str(cache_batch(tmp_path, runpod, required=True)), "--json", "--out",
               str(tmp_path / "out"), key_var=runpod.KEY_VAR)
    assert done.returncode == 1
    evs = events(done.stdout)
    assert [e["failure"] for e in evs if e["type"] == "JobEnded"] == ["no_capacity"]
    assert runpod.created == []


@pytest.fixture
def hyperstack(tmp_path: Path) -> Iterator[Any]:
    yield from serve("hyperstack", tmp_path)


def hyperstack_batch(tmp: Path, fake: Any) -> Path:
    batch = write_batch(tmp, "hyperstack", fake.url, gpus=["A100-80G"], seeds=[1], settings=fake.settings(),
                        attempts=2)
    (tmp / "code" / "job.py").write_text(CACHE_JOB)
    mount = tmp / "mnt" / "cache"
    cache = f'regions = ["NORWAY-1"]\ncache = {{ name = "weights", size_gb = 20, mount = "{mount}" }}\n'
    batch.write_text(batch.read_text().replace('gpu = "A100-80G"\n', 'gpu = "A100-80G"\n' + cache))
    return batch


def test_a_hyperstack_volume_is_attached_formatted_once_and_mounted_and_the_second_vm_reads_the_first_ones_file(
        tmp_path: Path, hyperstack: Any) -> None:
    done = cli(tmp_path, "run", str(hyperstack_batch(tmp_path, hyperstack)), "--json", "--out",
               str(tmp_path / "out"), key_var=hyperstack.KEY_VAR)
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    assert [(e["outcome"], e.get("failure")) for e in evs if e["type"] == "AttemptEnded"] == [
        ("failed", "retriable"), ("succeeded", None)]
    assert found(tmp_path) == "weights from attempt 0"  # a fresh VM mounted the first one's bytes
    opened = [(e["attempt"], e["created"], e["cold"]) for e in evs if e["type"] == "CacheOpened"]
    assert opened == [(0, True, False), (1, False, False)]
    (volume,) = hyperstack.volume_store.volumes.values()  # one volume, made once, kept by the run
    assert (volume["name"], volume["environment"]["region"], volume["size"]) == ("ar-cache-weights-norway-1",
                                                                                   "NORWAY-1", 20)
    assert volume["attachments"] == [] or all(a["status"] == "DETACHING" for a in volume["attachments"])
    vms = {b["name"] for b in hyperstack.created}
    assert len(vms) == 2  # two machines, one after the other
    assert hyperstack.volume_store.attaches >= 2  # attached to each, after its launch
    assert "volume_name" not in hyperstack.created[0]  # never at the create: a block volume attaches to a VM
    data = hyperstack.volume_store.dir / str(volume["id"])
    assert (data / "fs" / "lost+found").is_dir()  # formatted (once: the second VM found its file)
    assert (data / "fs" / "weights.bin").read_text() == "weights from attempt 0"
    assert not (tmp_path / "mnt" / "cache").is_symlink()  # the mount went with the machine
    assert hyperstack.alive() == []

    swept = cli(tmp_path, "sweep", key_var=hyperstack.KEY_VAR)
    assert swept.returncode == 0, swept.stderr
    line = next(x for x in swept.stdout.splitlines() if "ar-cache-weights" in x)
    assert str(volume["id"]) in line
    assert "kept" in line
    cost = cli(tmp_path, "cost", key_var=hyperstack.KEY_VAR)
    assert cost.returncode == 0, cost.stderr
    assert f"ar-cache-weights on hyperstack NORWAY-1 ({volume['id']}): 20 GB" in cost.stdout


def test_a_hyperstack_region_that_cannot_make_the_volume_starts_cold_and_says_so(
        tmp_path: Path, hyperstack: Any) -> None:
    hyperstack.volume_store.regions = set()
    done = cli(tmp_path, "run", str(hyperstack_batch(tmp_path, hyperstack)), "--json", "--out",
               str(tmp_path / "out"), key_var=hyperstack.KEY_VAR)
    assert done.returncode == 0, done.stderr
    cold = [e for e in events(done.stdout) if e["type"] == "CacheOpened"]
    assert [(e["cold"], e["region"]) for e in cold] == [(True, "NORWAY-1")]
    assert cold[0]["detail"] == "hyperstack cannot keep a volume in NORWAY-1: a cold start"
    assert found(tmp_path) == "no cache"
    assert hyperstack.volume_store.volumes == {}
    assert len(hyperstack.volume_store.asked) == 1  # it was asked for, and refused
    assert hyperstack.volume_store.attaches == 0


SHARED_JOB = NO_CACHE_ENDS + r'''found = sorted(n for n in os.listdir(cache) if n.startswith("seed-"))
open(os.path.join(cache, "seed-" + os.environ["ACTOR_RUN_SEED"]), "w").write("written")
open(os.path.join(out, "found.txt"), "w").write(",".join(found) or "empty")
'''


def test_two_leases_at_once_in_one_hyperstack_region_make_one_volume_and_both_jobs_run_warm(
        tmp_path: Path, hyperstack: Any) -> None:
    """Two seeds lease in NORWAY-1 at once: their caches are found or made one at a time, so one
    volume is asked for and both leases get it, even while the listing lags behind the create (a
    volume just made is missing from the next listing). One machine at a time there (stock 1: a
    block volume attaches to one VM), so the second seed's first create is refused and it runs on
    the machine after; it mounts the volume the first one wrote to."""
    hyperstack.volume_store.list_lag = 1
    hyperstack.stock[("n3-A100x1", "NORWAY-1")] = 1
    batch = write_batch(tmp_path, "hyperstack", hyperstack.url, gpus=["A100-80G"], seeds=[1, 2],
                        settings=hyperstack.settings(), attempts=2)
    (tmp_path / "code" / "job.py").write_text(SHARED_JOB)
    mount = tmp_path / "mnt" / "cache"
    cache = f'regions = ["NORWAY-1"]\ncache = {{ name = "weights", size_gb = 20, mount = "{mount}" }}\n'
    batch.write_text(batch.read_text().replace('gpu = "A100-80G"\n', 'gpu = "A100-80G"\n' + cache))
    done = cli(tmp_path, "run", str(batch), "--json", "--out", str(tmp_path / "out"), key_var=hyperstack.KEY_VAR)
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    assert sorted(e["outcome"] for e in evs if e["type"] == "JobEnded") == ["succeeded", "succeeded"]
    (volume,) = hyperstack.volume_store.volumes.values()
    assert len(hyperstack.volume_store.asked) == 1  # asked for once, not once per lease
    opened = [e for e in evs if e["type"] == "CacheOpened"]
    assert {e["seed"] for e in opened} == {1, 2}
    assert len(opened) >= 3  # each seed's lease, and the second seed's lease that found no stock
    assert [(e["cold"], e["detail"]) for e in opened if e["cold"]] == []  # nobody started cold
    assert {e["volume"] for e in opened} == {str(volume["id"])}
    assert sorted(e["created"] for e in opened) == [False] * (len(opened) - 1) + [True]
    seen = {seed: (tmp_path / "out" / "latest" / "rented" / f"seed-{seed}" / "out" / "found.txt").read_text()
            for seed in (1, 2)}
    assert sorted(seen.values()) in (["empty", "seed-1"], ["empty", "seed-2"])  # the later one read the first's
    data = hyperstack.volume_store.dir / str(volume["id"]) / "fs"
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("seed-")) == ["seed-1", "seed-2"]
    assert hyperstack.alive() == []
