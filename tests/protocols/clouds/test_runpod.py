"""The runpod cloud against a fake RunPod (REST v2) on loopback, held to RunPod's OpenAPI document,
whose pods are real sshd logins: offers, launch, connect, the pod's own deadline, delete, and the
answers the contract says RunPod gives (each fault a test)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fakes.keys import client_key
from fakes.runpod import FakeRunPod

from actor_run.actors import Reactor
from actor_run.protocols.clouds import make_cloud, parse_settings
from actor_run.protocols.clouds.runpod import RunPodCloud, classify_create
from actor_run.protocols.failures import Code, LaunchAmbiguous, LaunchRefused, MachineGone, SpecError
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import CandidateSpec


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPod]:
    server = FakeRunPod(tmp_path / "fake").start()
    try:
        yield server
    finally:
        server.stop()
    assert server.violations == []


def settings(fake: FakeRunPod, tmp_path: Path, **extra: object) -> dict[str, object]:
    return {"api_url": fake.url, "ssh_key": str(client_key(tmp_path / "keys")), "poll_s": 0.05,
            "listing_lag_s": 1.0, "delete_wait_s": 10.0, "launch_timeout_s": 10.0, **extra}


@pytest.fixture
def cloud(fake: FakeRunPod, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunPodCloud]:
    monkeypatch.setenv("RUNPOD_API_KEY", "test-key")
    c = make_cloud("runpod", settings(fake, tmp_path), tmp_path / "state")
    assert isinstance(c, RunPodCloud)
    return c


def name(n: int = 1, deadline: float | None = None) -> str:
    return f"ar-t-{n}-a0-0123abcd-d{int(deadline or time.time() + 3600)}"


def a100(region: str = "EU-RO-1") -> Offer:
    return Offer(cloud="runpod", region=region, gpu="A100-80G", hourly_usd=1.89, kind="NVIDIA A100-SXM4-80GB")


def test_a_missing_key_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    with pytest.raises(SpecError, match="RUNPOD_API_KEY"):
        make_cloud("runpod", {"ssh_key": str(client_key(tmp_path / "k"))}, tmp_path)
    monkeypatch.setenv("MY_RUNPOD", "k")
    assert parse_settings("runpod", {"api_key_env": "MY_RUNPOD", "cloud": "COMMUNITY"}).cloud == "COMMUNITY"
    with pytest.raises(SpecError, match=r"clouds\.runpod\.cloud"):
        parse_settings("runpod", {"cloud": "CHEAP"})


def test_the_answer_table_follows_the_contract() -> None:
    assert classify_create(500, '{"detail":"create pod: There are no instances currently available"}') \
        is Code.NO_CAPACITY
    assert classify_create(500, '{"detail":"Your account balance is too low to rent a pod"}') is Code.NO_CAPACITY
    assert classify_create(500, '{"detail":"upstream timeout"}') is None  # ambiguous: it may have made one
    assert classify_create(401, "") is Code.GUARD
    assert classify_create(400, "bad") is Code.LAUNCH_FAILED


def test_offers_come_from_the_catalog_in_price_order(reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    offers = reactor.call(cloud.offers, CandidateSpec(cloud="runpod", gpu="A100-80G"), 0, timeout=30)
    assert [(o.region, o.hourly_usd, o.kind) for o in offers] == [
        ("EU-RO-1", 1.89, "NVIDIA A100-SXM4-80GB"), ("US-TX-3", 1.89, "NVIDIA A100-SXM4-80GB")]
    with fake.lock:
        fake.stock[("NVIDIA A100-SXM4-80GB", "EU-RO-1")] = 0
    only = reactor.call(cloud.offers, CandidateSpec(cloud="runpod", gpu="A100-80G", regions=["EU-RO-1", "US-TX-3"]),
                        0, timeout=30)
    assert [o.region for o in only] == ["US-TX-3"]
    assert reactor.call(cloud.offers, CandidateSpec(cloud="runpod", gpu="H100", max_hourly_usd=2.0), 0,
                        timeout=30) == []


def test_a_pod_is_launched_connected_and_deleted_for_certain(reactor: Reactor, cloud: RunPodCloud,
                                                           fake: FakeRunPod) -> None:
    n = name()
    machine = reactor.call(cloud.launch, a100(), n, time.time() + 3600, timeout=30)
    assert machine.hourly_usd == 1.89
    assert machine.region == "EU-RO-1"
    assert machine.port > 1
    ws = reactor.call(cloud.connect, machine, timeout=30)
    home = fake.boxes.boxes[machine.id].home
    assert ws.root == str(home / ".actor-run")  # the pod's own HOME, through ~
    assert reactor.call(ws.host.run, "echo $RUNPOD_POD_ID", timeout=30).text().strip() == machine.id
    assert (home / ".actor-run" / "deadline.sh").is_file()
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []
    # create, readiness read, delete, the read that proves it gone
    assert (fake.count("POST", "/v2/pods"), fake.count("DELETE", "/v2/pods/{id}")) == (1, 1)
    assert fake.count("GET", "/v2/pods/{id}", 404) == 1


def test_the_pod_deletes_itself_at_its_deadline_with_its_own_key(reactor: Reactor, cloud: RunPodCloud,
                                                                 fake: FakeRunPod) -> None:
    n = name(deadline=time.time() + 2)
    machine = reactor.call(cloud.launch, a100(), n, time.time() + 2, timeout=30)
    ws = reactor.call(cloud.connect, machine, timeout=30)
    reactor.call(ws.aclose, timeout=30)
    fake.wait_for(lambda: n in fake.self_deleted, timeout=30)
    assert fake.alive() == []
    reactor.call(cloud.delete, n, machine.id, timeout=30)  # gone already: a 404 is gone


def test_no_stock_is_a_clean_no_capacity(reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    with fake.lock:
        fake.stock[("NVIDIA A100-SXM4-80GB", "EU-RO-1")] = 0
    with pytest.raises(LaunchRefused) as info:
        reactor.call(cloud.launch, a100(), name(), time.time() + 3600, timeout=30)
    assert info.value.code is Code.NO_CAPACITY
    assert not isinstance(info.value, LaunchAmbiguous)
    assert fake.alive() == []


def test_a_create_answered_500_that_made_the_pod_is_found_by_name_and_deleted(
        reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    with fake.lock:
        fake.create_500_made = 1
        fake.lag_reads = 2  # and the listing lags the create
    n = name()
    with pytest.raises(LaunchAmbiguous):
        reactor.call(cloud.launch, a100(), n, time.time() + 3600, timeout=30)
    assert fake.alive() == [n]
    reactor.call(cloud.delete, n, "", timeout=30)  # by name: what the lease does after ambiguous_create
    assert fake.alive() == []
    assert [b[0] for b in fake.billed] == [n]


def test_a_429_is_waited_out_as_asked(reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    fake.rate_limit(1, retry_after=1)
    t0 = time.monotonic()
    offers = reactor.call(cloud.offers, CandidateSpec(cloud="runpod", gpu="A100-80G"), 0, timeout=30)
    assert offers
    assert time.monotonic() - t0 >= 1.0
    assert cloud.api.statistics().rate_limited == 1
    assert fake.rate_limited_sent == 1


def test_a_refused_key_is_guard(reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    fake.token = "another-key"
    for call in (lambda: reactor.call(cloud.offers, CandidateSpec(cloud="runpod", gpu="A100-80G"), 0, timeout=30),
                 lambda: reactor.call(cloud.launch, a100(), name(), time.time() + 3600, timeout=30)):
        with pytest.raises(LaunchRefused) as info:
            call()
        assert info.value.code is Code.GUARD
    assert fake.alive() == []


def test_a_pod_stuck_provisioning_is_launch_failed(reactor: Reactor, fake: FakeRunPod, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "test-key")
    cloud = make_cloud("runpod", settings(fake, tmp_path, launch_timeout_s=0.5), tmp_path / "state")
    fake.stuck = True
    n = name()
    with pytest.raises(LaunchAmbiguous) as info:
        reactor.call(cloud.launch, a100(), n, time.time() + 3600, timeout=30)
    assert info.value.code is Code.LAUNCH_FAILED
    reactor.call(cloud.delete, n, "", timeout=30)
    assert fake.alive() == []


def test_a_delete_that_fails_once_is_verified_and_asked_again(reactor: Reactor, cloud: RunPodCloud,
                                                              fake: FakeRunPod) -> None:
    n = name()
    machine = reactor.call(cloud.launch, a100(), n, time.time() + 3600, timeout=30)
    fake.delete_fail = 1
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []
    assert fake.count("DELETE", "/v2/pods/{id}", 500) == 1
    assert fake.count("DELETE", "/v2/pods/{id}", 204) == 1


def test_a_pod_that_vanishes_is_machine_gone(reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    n = name()
    machine = reactor.call(cloud.launch, a100(), n, time.time() + 3600, timeout=30)
    ws = reactor.call(cloud.connect, machine, timeout=30)
    fake.vanish(machine.id)
    with pytest.raises(MachineGone):
        reactor.call(ws.host.run, "true", timeout=30)
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert [m.name for m in reactor.call(cloud.list_ours, "ar-", timeout=30)] == []


def test_the_fake_refuses_what_runpod_would(fake: FakeRunPod) -> None:
    body = {"name": "x", "image": "img", "gpu": {"id": "NVIDIA A100-SXM4-80GB"}, "region": "EU"}  # no such key
    resp = httpx.post(f"{fake.url}/v2/pods", json=body, headers={"Authorization": "Bearer test-key"})
    assert resp.status_code == 400
    assert fake.alive() == []
    assert len(fake.violations) == 1
    assert "region" in fake.violations[0]
    fake.violations.clear()
