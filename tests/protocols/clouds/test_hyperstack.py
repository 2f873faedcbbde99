"""Hyperstack's create (protocols/clouds/hyperstack.py) against the fake on loopback (held to
Hyperstack's OpenAPI document; VMs that are real sshd logins): what it reads before the POST (the
region's images, for an offer that names none) fails clean when the provider does not answer it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.providers import rented_cloud, serve

from actor_run.actors import Reactor
from actor_run.protocols.failures import Code, LaunchAmbiguous, LaunchRefused


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
