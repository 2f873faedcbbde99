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
from actor_run.protocols.failures import Code, LaunchRefused, SpecError
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
    assert classify_create(500, '{"detail":"Your account balance is too low to rent a pod"}') is Code.QUOTA
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


def test_a_pod_takes_our_key_and_costs_four_calls(reactor: Reactor, cloud: RunPodCloud, fake: FakeRunPod) -> None:
    n = name()
    machine = reactor.call(cloud.launch, a100(), n, time.time() + 3600, timeout=30)
    ws = reactor.call(cloud.connect, machine, timeout=30)
    assert reactor.call(ws.host.run, "echo $RUNPOD_POD_ID", timeout=30).text().strip() == machine.id
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    # create, readiness read, delete, the read that proves it gone
    assert [(m, t) for m, t, _ in fake.calls] == [
        ("POST", "/v2/pods"), ("GET", "/v2/pods/{id}"), ("DELETE", "/v2/pods/{id}"), ("GET", "/v2/pods/{id}")]


def test_the_pod_deletes_itself_at_its_deadline_with_its_own_key(reactor: Reactor, cloud: RunPodCloud,
                                                                 fake: FakeRunPod) -> None:
    n = name(deadline=time.time() + 2)
    machine = reactor.call(cloud.launch, a100(), n, time.time() + 2, timeout=30)
    ws = reactor.call(cloud.connect, machine, timeout=30)
    reactor.call(ws.aclose, timeout=30)
    fake.wait_for(lambda: n in fake.self_deleted, timeout=30)
    assert fake.alive() == []
    reactor.call(cloud.delete, n, machine.id, timeout=30)  # gone already: a 404 is gone


def test_the_fake_refuses_what_runpod_would(fake: FakeRunPod) -> None:
    body = {"name": "x", "image": "img", "gpu": {"id": "NVIDIA A100-SXM4-80GB"}, "region": "EU"}  # no such key
    resp = httpx.post(f"{fake.url}/v2/pods", json=body, headers={"Authorization": "Bearer test-key"})
    assert resp.status_code == 400
    assert fake.alive() == []
    assert len(fake.violations) == 1
    assert "region" in fake.violations[0]
    fake.violations.clear()


def test_an_account_has_its_own_key_and_its_machines_carry_it(reactor: Reactor, fake: FakeRunPod, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "main-key")
    monkeypatch.setenv("RUNPOD_KEY_B", "test-key")  # the one the fake takes
    raw = {**settings(fake, tmp_path), "accounts": {"team-b": {"api_key_env": "RUNPOD_KEY_B"}}}
    main, team_b = make_cloud("runpod", raw, tmp_path / "s"), make_cloud("runpod@team-b", raw, tmp_path / "s")
    with pytest.raises(LaunchRefused) as info:
        reactor.call(main.offers, CandidateSpec(cloud="runpod", gpu="A100-80G"), 0, timeout=30)
    assert info.value.code is Code.GUARD
    n = name()
    machine = reactor.call(team_b.launch, a100(), n, time.time() + 3600, timeout=30)
    assert machine.account == "team-b"
    assert [m.account for m in reactor.call(team_b.list_ours, "ar-", timeout=30)] == ["team-b"]
    reactor.call(team_b.delete, n, machine.id, timeout=30)
    assert fake.alive() == []
