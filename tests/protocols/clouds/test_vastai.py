"""The `vastai` cloud against its fake (held to Vast's OpenAPI document, machines that are real sshd
logins): Vast's own traps, each from vastai.md, each answered by the adapter. The checks every
rented cloud passes run in test_rented.py (FAKES holds this fake too)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.providers import rented_cloud, serve
from fakes.vastai import FakeVast

from actor_run.actors import Reactor
from actor_run.protocols.clouds.gpus import MIN_CUDA, min_cuda
from actor_run.protocols.clouds.vastai import pace, seen_instance
from actor_run.protocols.failures import Code, LaunchAmbiguous, LaunchRefused, MachineGone
from actor_run.protocols.specs import CandidateSpec


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeVast]:
    yield from serve("vastai", tmp_path)


def make(fake: FakeVast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: object) -> Any:
    return rented_cloud(fake, tmp_path, monkeypatch, **{"listing_lag_s": 5.0, **extra})


@pytest.fixture
def cloud(fake: FakeVast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return make(fake, tmp_path, monkeypatch)


def name(n: int = 1, deadline: float | None = None) -> str:
    return f"ar-v-{n}-a0-0123abcd-d{int(deadline or time.time() + 3600)}"


def test_offers_are_the_search_s_filters_for_a_gpu_job_cheapest_first(reactor: Reactor, cloud: Any,
                                                                       fake: FakeVast) -> None:
    offers = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G"), 0, timeout=60)
    # the cheaper unverified and unreliable hosts are filtered out by the search itself
    assert [o.kind for o in offers] == ["24817000", "24817001", "24817002", "24817003"]
    assert [o.hourly_usd for o in offers] == sorted(o.hourly_usd for o in offers)
    assert offers[0].region == "Texas, US"  # its stray whitespace stripped
    assert offers[0].interruptible_usd == pytest.approx(0.45 + 0.02)  # the bid price beside the on-demand one
    h100 = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="H100"), 0, timeout=60)
    assert "24817008" not in [o.kind for o in h100]  # cheapest H100, its host's CUDA 11.2 below the class's 11.8
    assert fake.created == []  # a search makes nothing
    ceiling = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G", max_hourly_usd=1.2), 0,
                           timeout=60)
    assert [o.kind for o in ceiling] == ["24817000", "24817001"]
    canada = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G", regions=["CA"]), 0, timeout=60)
    assert [o.kind for o in canada] == ["24817001"]


def test_the_cuda_floor_is_a_column_of_its_own_for_every_gpu_class() -> None:
    from actor_run.protocols.clouds.gpus import GPUS

    assert set(MIN_CUDA) == set(GPUS)
    assert min_cuda("h100") == 11.8
    assert min_cuda("B200") == 12.8
    assert min_cuda("some new gpu") == 0.0


def test_an_interruptible_candidate_bids_and_a_cap_below_the_floor_finds_nothing(
        reactor: Reactor, cloud: Any, fake: FakeVast) -> None:
    offers = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G", interruptible=True), 0,
                          timeout=60)
    assert offers[0].interruptible
    assert offers[0].hourly_usd == pytest.approx(0.45 * 1.1)  # the offer's min_bid and the margin
    capped = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G", interruptible=True,
                                                      max_bid_usd=0.47), 0, timeout=60)
    assert [(o.kind, o.hourly_usd) for o in capped] == [("24817000", 0.47)]  # the others take no bid this low
    n = name()
    machine = reactor.call(cloud.launch, capped[0], n, time.time() + 3600, timeout=60)
    assert fake.created[-1]["price"] == 0.47
    assert "cancel_unavail" not in fake.created[-1]
    reactor.call(cloud.delete, n, machine.id, timeout=60)
    assert fake.alive() == []


def test_a_losing_bid_that_made_a_stopped_instance_is_destroyed_and_refused_cleanly(
        reactor: Reactor, cloud: Any, fake: FakeVast) -> None:
    offer = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G", interruptible=True), 0,
                         timeout=60)[0]
    fake.launch_answers = ["outbid"]
    with pytest.raises(LaunchRefused) as info:
        reactor.call(cloud.launch, offer, name(), time.time() + 3600, timeout=60)
    assert info.value.code is Code.NO_CAPACITY
    assert not isinstance(info.value, LaunchAmbiguous)
    assert fake.alive() == []  # it was made (stopped, its disk billing) and destroyed
    assert len(fake.billed) == 1


@pytest.mark.parametrize("status", ["exited", "unknown", "offline"])
def test_an_instance_that_goes_dead_is_launch_failed_and_deleted(reactor: Reactor, cloud: Any, fake: FakeVast,
                                                                 status: str) -> None:
    fake.launch_answers = [status]
    n = name()
    with pytest.raises(LaunchAmbiguous) as info:
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert info.value.code is Code.LAUNCH_FAILED
    assert status in str(info.value)
    reactor.call(cloud.delete, n, "", timeout=60)  # what the lease does: by name (by label at Vast)
    assert fake.alive() == []


def test_a_new_instance_that_reads_null_for_a_while_is_waited_for(reactor: Reactor, cloud: Any,
                                                                  fake: FakeVast) -> None:
    fake.null_reads = 5
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert machine.address == fake.instances[int(machine.id)]["public_ipaddr"].strip()
    assert fake.instances[int(machine.id)]["public_ipaddr"] != machine.address  # the fake's stray space
    reactor.call(cloud.delete, n, machine.id, timeout=60)
    assert fake.alive() == []


def test_an_instance_still_null_past_listing_lag_is_ambiguous_and_deleted_by_label(
        reactor: Reactor, fake: FakeVast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made, then `show` null longer than reads may lag: never a clean refusal (the instance bills)."""
    cloud = make(fake, tmp_path, monkeypatch, listing_lag_s=0.5)
    fake.null_reads = 10_000
    n = name()
    with pytest.raises(LaunchAmbiguous) as info:
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert info.value.code is Code.LAUNCH_FAILED
    assert fake.alive() == [n]
    reactor.call(cloud.delete, n, "", timeout=60)  # what the lease does after an ambiguous launch
    assert fake.alive() == []


def test_a_plain_text_429_waits_the_endpoint_s_documented_interval(reactor: Reactor, cloud: Any,
                                                                  fake: FakeVast) -> None:
    assert pace("PUT", "/api/v0/asks/24817000/") == 4.5
    assert pace("DELETE", "/api/v0/instances/1/") == 3.0
    assert pace("GET", "/api/v0/instances/1/") == 2.0
    assert pace("GET", "/api/v1/instances/") == 1.0
    reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G"), 0, timeout=60)
    reactor.call(cloud._register_key, timeout=60)
    fake.rate_limit(1)  # the next request (the create) is answered 429 in plain text, no Retry-After
    t0 = time.monotonic()
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert time.monotonic() - t0 >= 4.5
    assert cloud.api.statistics().rate_limited == 1
    assert fake.count("PUT", "/api/v0/asks/{id}") == 2  # the same create, sent again after the wait
    assert fake.alive() == [n]
    reactor.call(cloud.delete, n, machine.id, timeout=60)


def test_an_ambiguous_create_is_found_by_label_through_the_paged_list(reactor: Reactor, cloud: Any,
                                                                      fake: FakeVast) -> None:
    fake.page_size = 2
    for i in range(3):
        fake.foreign(f"notebook-{i}")
    fake.create_500_made = 1
    fake.lag_reads = 2
    n = name()
    with pytest.raises(LaunchAmbiguous):
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert n in fake.alive()
    reactor.call(cloud.delete, n, "", timeout=60)
    assert fake.alive() == ["notebook-0", "notebook-1", "notebook-2"]  # theirs untouched
    assert fake.count("GET", "/api/v1/instances") >= 2  # pages followed


def test_an_outbid_instance_is_machine_gone_and_destroyed(reactor: Reactor, cloud: Any, fake: FakeVast) -> None:
    offer = reactor.call(cloud.offers, CandidateSpec(cloud="vastai", gpu="A100-80G", interruptible=True), 0,
                         timeout=60)[0]
    n = name()
    machine = reactor.call(cloud.launch, offer, n, time.time() + 3600, timeout=60)
    ws = reactor.call(cloud.connect, machine, timeout=60)
    fake.outbid(machine.id)
    with pytest.raises(MachineGone):
        reactor.call(ws.host.run, "true", timeout=60)
    reactor.call(ws.aclose, timeout=30)
    assert fake.alive() == [n]  # stopped, its disk billing, until destroyed
    reactor.call(cloud.delete, n, machine.id, timeout=60)
    assert fake.alive() == []


def test_the_instance_destroys_itself_at_its_deadline(reactor: Reactor, cloud: Any, fake: FakeVast) -> None:
    """Vast keeps no deadline: the machine's own, with the instance-scoped key (never ours)."""
    deadline = time.time() + 3
    n = name(deadline=deadline)
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, deadline, timeout=60)
    ws = reactor.call(cloud.connect, machine, timeout=60)
    script = (fake.boxes.boxes[machine.id].home / ".actor-run" / "deadline.sh").read_text()
    assert "test-key" not in script
    reactor.call(ws.aclose, timeout=30)
    fake.wait_for(lambda: fake.alive() == [], timeout=60)
    assert fake.count("DELETE", "/api/v0/instances/{id}", 200) == 1  # by the container's key
    assert reactor.call(cloud.list_ours, "ar-", timeout=60) == []


def test_a_seen_instance_strips_and_reads_vast_s_states() -> None:
    base = {"id": 7, "label": " ar-x \n", "actual_status": "running", "public_ipaddr": " 1.2.3.4\n",
            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40022"}]}, "geolocation": "Texas, US "}
    from actor_run.protocols.clouds.vastai import clean

    seen = seen_instance(clean(base))
    assert (seen.state, seen.name, seen.address, seen.port, seen.region) == ("ready", "ar-x", "1.2.3.4", 40022,
                                                                             "Texas, US")
    outbid = seen_instance({**base, "actual_status": "stopped", "intended_status": "stopped",
                            "cur_state": "stopped", "is_bid": True})
    assert (outbid.state, outbid.taken, outbid.detail) == ("failed", True, "stopped (outbid)")
    assert seen_instance({**base, "actual_status": None}).state == "pending"
    assert seen_instance({**base, "ports": None}).state == "pending"  # running, no SSH mapping yet
    assert seen_instance({**base, "cur_state": "unloaded"}).state == "gone"

