"""Hyperstack (protocols/clouds/hyperstack.py) against the fake on loopback (held to Hyperstack's
OpenAPI document; VMs that are real sshd logins): what the create reads before the POST (the
region's images, for an offer that names none) fails clean when the provider does not answer it;
a cache's volume is made once per region, whoever asks at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes.providers import rented_cloud, serve

from actor_run.actors import Reactor
from actor_run.protocols.failures import Code, LaunchAmbiguous, LaunchRefused
from actor_run.protocols.messages import CacheSpec, Offer


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Any]:
    yield from serve("hyperstack", tmp_path)


def name(n: int = 1) -> str:
    return f"ar-t-{n}-a0-0123abcd-d{int(time.time() + 3600)}"


def test_an_image_listing_that_fails_before_the_create_is_a_clean_refusal(
        reactor: Reactor, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An offer without an image (one a resumed run read from its ledger) makes the create read the
    region's images first; a 500 there refuses the launch cleanly (launch_failed, not ambiguous: no
    machine to reconcile), nothing was asked for, and the next launch reads the images again."""
    cloud = rented_cloud(fake, tmp_path, monkeypatch)
    offer = fake.sample_offer()
    assert offer.image == ""
    fake.images_500 = 1
    with pytest.raises(LaunchRefused) as info:
        reactor.call(cloud.launch, offer, name(1), time.time() + 3600, timeout=60)
    assert not isinstance(info.value, LaunchAmbiguous)
    assert info.value.code is Code.LAUNCH_FAILED
    assert "images of NORWAY-1" in str(info.value)
    assert fake.created == []  # no create went out
    assert fake.count("POST", "/core/virtual-machines") == 0
    assert fake.alive() == []

    machine = reactor.call(cloud.launch, offer, name(2), time.time() + 3600, timeout=60)  # read again: it works
    assert fake.created[0]["image_name"] == "Ubuntu Server 24.04 LTS R570 CUDA 12.8"
    reactor.call(cloud.delete, machine.name, machine.id, timeout=60)
    assert fake.alive() == []
    reactor.call(cloud.aclose, timeout=30)



def test_an_offer_without_image_where_the_region_has_none_for_its_gpu_is_refused_before_any_create(
        reactor: Reactor, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CANADA-1 has no image with a CUDA new enough for a B200: an offer there that names no image is
    a clean no_capacity (the walk goes on), and no create is sent with an empty image."""
    cloud = rented_cloud(fake, tmp_path, monkeypatch)
    offer = Offer(cloud="hyperstack", region="CANADA-1", gpu="B200", hourly_usd=5.50672, kind="n3-B200x1")
    with pytest.raises(LaunchRefused) as info:
        reactor.call(cloud.launch, offer, name(3), time.time() + 3600, timeout=60)
    assert not isinstance(info.value, LaunchAmbiguous)
    assert info.value.code is Code.NO_CAPACITY
    assert fake.created == []
    reactor.call(cloud.aclose, timeout=30)

def test_a_cache_volume_another_controller_made_a_moment_ago_is_used_not_given_up(
        reactor: Reactor, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two controllers (two cloud objects) open one cache in one region: the second's listing lags
    behind the first's create, so its own create is refused 409 (names are unique per account); it
    looks again and has the same volume, instead of a cold start."""
    fake.volume_store.list_lag = 1
    first = rented_cloud(fake, tmp_path / "one", monkeypatch)
    second = rented_cloud(fake, tmp_path / "two", monkeypatch)
    offer, cache = fake.sample_offer(), CacheSpec(name="weights", size_gb=20, mount="/cache")
    made = reactor.call(first.open_cache, offer, cache, timeout=60)
    found = reactor.call(second.open_cache, offer, cache, timeout=60)
    assert made is not None
    assert made.created
    assert found is not None
    assert (found.id, found.created, found.path) == (made.id, False, "/cache")
    assert len(fake.volume_store.volumes) == 1
    assert fake.count("POST", "/core/volumes", 409) == 1
    for cloud in (first, second):
        reactor.call(cloud.aclose, timeout=30)


def test_leases_asking_at_once_in_one_region_make_one_volume(
        reactor: Reactor, fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight leases of one controller open one cache in one region at once (the listing lagging):
    one create, and all eight have the volume."""
    fake.volume_store.list_lag = 1
    cloud = rented_cloud(fake, tmp_path, monkeypatch)
    offer, cache = fake.sample_offer(), CacheSpec(name="weights", size_gb=20, mount="/cache")

    async def open_all() -> list[Any]:
        got: list[Any] = []

        async def one() -> None:
            got.append(await cloud.open_cache(offer, cache))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        return got

    got = reactor.call(open_all, timeout=60)
    (volume,) = fake.volume_store.volumes.values()
    assert [v.id if v is not None else None for v in got] == [str(volume["id"])] * 8
    assert sorted(v.created for v in got) == [False] * 7 + [True]
    assert len(fake.volume_store.asked) == 1
    reactor.call(cloud.aclose, timeout=30)
