"""Cache volumes at the provider (issue 42), each adapter against its vendor's fake (real HTTP held to
the vendor's OpenAPI document): RunPod network volumes and Lambda file systems are found or made per
region, attached at the create, listed and deleted; a region that refuses one is a cold start (None).
The whole path through a batch (the job's second attempt finds the first's file) is
tests/supervisors/test_caches.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from fakes.providers import rented_cloud, serve

from actor_run.actors.caches import open_cache_once
from actor_run.actors.runtime import Reactor
from actor_run.protocols.messages import CacheSpec

CACHE = CacheSpec(name="weights", size_gb=20, mount="/data/cache")  # a path Lambda takes; the fakes link nothing


@pytest.fixture(params=["lambda", "runpod"])
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from serve(request.param, tmp_path, virtual=True)  # no sshd: only the API is asked


@pytest.fixture
def cloud(fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return rented_cloud(fake, tmp_path, monkeypatch, launch_timeout_s=540.0)  # the clouds' own default


def attached(fake: Any, body: dict[str, Any]) -> str:
    """The volume the create asked to attach, in the vendor's words (RunPod: its id; Lambda: its name)."""
    if fake.CLOUD == "runpod":
        return str(body["mounts"]["network"][0]["volumeId"])
    assert body["file_system_mounts"][0]["mount_point"] == "/data/cache"
    return str(body["file_system_names"][0])


def test_a_cache_is_made_once_per_region_found_again_attached_listed_and_deleted(
        reactor: Reactor, cloud: Any, fake: Any) -> None:
    offer = fake.sample_offer()
    made = reactor.call(cloud.open_cache, offer, CACHE, timeout=30)
    assert (made.name, made.region, made.created) == ("ar-cache-weights", offer.region, True)
    again = reactor.call(cloud.open_cache, offer, CACHE, timeout=30)
    assert (again.id, again.created) == (made.id, False)  # found, not made twice
    assert made.path == again.path == ("/data/cache" if fake.CLOUD == "lambda" else CACHE.mount)
    placed = msgspec.structs.replace(offer, cache=made.id, cache_path=made.path)
    name = f"ar-t-1-a0-0123abcd-d{int(time.time() + 3600)}"
    machine = reactor.call(cloud.launch, placed, name, time.time() + 3600, timeout=30)
    assert machine.cache == made.path  # what the job gets in ACTOR_RUN_CACHE
    want = made.id if fake.CLOUD == "runpod" else f"ar-cache-weights-{offer.region}"
    assert attached(fake, fake.created[-1]) == want
    reactor.call(cloud.delete, name, machine.id, timeout=30)
    listed = reactor.call(cloud.list_caches, timeout=30)
    assert [(v.name, v.region, v.id) for v in listed] == [("ar-cache-weights", offer.region, made.id)]
    reactor.call(cloud.delete_cache, made.id, timeout=30)
    assert reactor.call(cloud.list_caches, timeout=30) == []


def test_a_region_that_refuses_a_volume_is_a_cold_start(reactor: Reactor, cloud: Any, fake: Any) -> None:
    if fake.CLOUD == "runpod":
        fake.volume_dcs = set()
    else:
        fake.fs_regions = set()
    assert reactor.call(cloud.open_cache, fake.sample_offer(), CACHE, timeout=30) is None
    assert reactor.call(cloud.list_caches, timeout=30) == []



def test_leases_opening_one_cache_at_once_in_one_region_share_one_volume(
        reactor: Reactor, cloud: Any, fake: Any) -> None:
    """Four leases of one controller open one cache in one region at once, as a lease opens it
    (actors/caches.py `open_cache_once`): one volume is made and each lease has it."""
    offer = fake.sample_offer()
    got = reactor.call(_open_at_once, cloud, offer, 4, True, timeout=60)
    listed = reactor.call(cloud.list_caches, timeout=30)
    assert len(listed) == 1, listed
    assert [v.id if v is not None else None for v in got] == [listed[0].id] * 4
    assert sorted(v.created for v in got) == [False] * 3 + [True]


def test_a_lambda_file_system_another_controller_made_meanwhile_is_used(
        reactor: Reactor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two controllers (no lock between them) open one cache in one region at once: Lambda refuses the
    second create as a duplicate (`global/duplicate`), and that one finds the first's file system."""
    for fake in serve("lambda", tmp_path, virtual=True):
        cloud = rented_cloud(fake, tmp_path, monkeypatch, launch_timeout_s=540.0)
        got = reactor.call(_open_at_once, cloud, fake.sample_offer(), 2, False, timeout=60)
        (listed,) = reactor.call(cloud.list_caches, timeout=30)
        assert [v.id if v is not None else None for v in got] == [listed.id] * 2


def test_runpod_controllers_that_made_one_cache_at_once_keep_one_volume(
        reactor: Reactor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two controllers (no lock between them) open one cache in one data center at once: RunPod's
    names are not unique, so each makes a volume; each then looks again, the one whose volume has not
    the least id deletes its own, and both use the other. A third open, and any later one, finds
    that volume, also where an earlier race left two."""
    for fake in serve("runpod", tmp_path, virtual=True):
        cloud = rented_cloud(fake, tmp_path, monkeypatch, launch_timeout_s=540.0)
        offer = fake.sample_offer()
        got = reactor.call(_open_at_once, cloud, offer, 2, False, timeout=60)
        assert len(fake.volumes_made) == 2, fake.volumes_made  # the race happened: each made one
        (kept,) = reactor.call(cloud.list_caches, timeout=30)
        assert [v.id if v is not None else None for v in got] == [kept.id] * 2
        fake.volumes["vol9999"] = {**fake.volumes[kept.id], "id": "vol9999"}  # a duplicate an earlier race kept
        again = reactor.call(cloud.open_cache, offer, CACHE, timeout=30)
        assert (again.id, again.created) == (kept.id, False)


async def _open_at_once(cloud: Any, offer: Any, n: int, as_a_lease: bool) -> list[Any]:
    got: list[Any] = []

    async def one() -> None:
        got.append(await (open_cache_once(cloud, offer, CACHE) if as_a_lease else cloud.open_cache(offer, CACHE)))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return got
