"""The `shadeform` cloud against its fake (held to Shadeform's OpenAPI document, machines that are
real sshd logins): offers across the underlying clouds, the provider-kept deadline, spot
reclaims, ambiguous creates reconciled by name and tag. The checks every rented cloud passes run
in test_rented.py (FAKES holds this fake too)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.providers import rented_cloud, serve
from fakes.shadeform import FakeShadeform
from support.waits import poll

from actor_run.actors import Reactor
from actor_run.protocols.clouds import parse_settings
from actor_run.protocols.clouds.shadeform import classify_create, seen_instance
from actor_run.protocols.failures import Code, LaunchAmbiguous, MachineGone
from actor_run.protocols.specs import CandidateSpec


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeShadeform]:
    yield from serve("shadeform", tmp_path)


def make(fake: FakeShadeform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: object) -> Any:
    return rented_cloud(fake, tmp_path, monkeypatch, **{"listing_lag_s": 2.0, **extra})


@pytest.fixture
def cloud(fake: FakeShadeform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return make(fake, tmp_path, monkeypatch)


def name(n: int = 1, deadline: float | None = None) -> str:
    return f"ar-s-{n}-a0-0123abcd-d{int(deadline or time.time() + 3600)}"


def test_offers_span_the_underlying_clouds_and_the_setting_restricts_them(
        reactor: Reactor, cloud: Any, fake: FakeShadeform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offers = reactor.call(cloud.offers, CandidateSpec(cloud="shadeform", gpu="A100-80G"), 0, timeout=60)
    assert [(o.kind, o.region, o.hourly_usd) for o in offers] == [
        ("lambdalabs/A100_80G", "us-east-1", 1.79), ("hyperstack/A100_80G", "canada-1", 1.80),
        ("hyperstack/A100_80G", "norway-1", 1.80)]
    assert [o.interruptible_usd for o in offers] == [0.0, 1.10, 0.0]  # the spot price beside, where sold
    only = make(fake, tmp_path, monkeypatch, clouds=["hyperstack"])
    assert {o.kind for o in reactor.call(only.offers, CandidateSpec(cloud="shadeform", gpu="A100-80G"), 0,
                                         timeout=60)} == {"hyperstack/A100_80G"}
    spot = reactor.call(cloud.offers, CandidateSpec(cloud="shadeform", gpu="H100", interruptible=True), 0, timeout=60)
    assert [(o.kind, o.region, o.hourly_usd, o.interruptible) for o in spot] == [
        ("datacrunch/H100", "FIN-01", 1.30, True)]


def test_the_default_launch_timeout_allows_for_the_slowest_clouds() -> None:
    settings = parse_settings("shadeform", {})
    assert settings.launch_timeout_s >= 40 * 60  # "upwards of 30-40 minutes" (shadeform.md §3)


def test_a_create_carries_name_key_tags_and_the_machine_s_deadline_as_auto_delete(
        reactor: Reactor, cloud: Any, fake: FakeShadeform) -> None:
    deadline = time.time() + 3600
    n = name(deadline=deadline)
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, deadline, timeout=60)
    [body] = fake.created
    assert (body["name"], body["cloud"], body["region"], body["shade_instance_type"]) == (
        n, "hyperstack", "canada-1", "A100_80G")
    assert body["ssh_key_id"] in fake.keys
    assert f"actor-run-name={n}" in body["tags"]
    threshold = datetime.datetime.fromisoformat(body["auto_delete"]["date_threshold"]).timestamp()
    assert abs(threshold - deadline) < 60
    assert "spend_threshold" not in body["auto_delete"]  # no budget caps this offer's attempt
    assert body["rental_type"] == "on_demand"
    reactor.call(cloud.delete, n, machine.id, timeout=60)
    assert fake.alive() == []


def test_shadeform_deletes_the_machine_at_its_deadline_whatever_became_of_us(
        reactor: Reactor, cloud: Any, fake: FakeShadeform) -> None:
    deadline = time.time() + 15  # room for the launch on a loaded machine
    n = name(deadline=deadline)
    reactor.call(cloud.launch, fake.sample_offer(), n, deadline, timeout=60)
    assert n in fake.alive()
    # no process of ours deletes it: the provider does (at its first look after the threshold)
    poll(lambda: not reactor.call(cloud.list_ours, "ar-", timeout=60), 60, "Shadeform's auto_delete", every=0.5)
    assert time.time() >= deadline
    assert fake.auto_deleted == [n]
    assert fake.alive() == []


def test_a_reclaimed_spot_instance_is_machine_gone(reactor: Reactor, cloud: Any, fake: FakeShadeform) -> None:
    [offer] = reactor.call(cloud.offers, CandidateSpec(cloud="shadeform", gpu="H100", interruptible=True), 0,
                           timeout=60)
    n = name()
    machine = reactor.call(cloud.launch, offer, n, time.time() + 3600, timeout=60)
    assert fake.created[-1]["rental_type"] == "spot"
    ws = reactor.call(cloud.connect, machine, timeout=60)
    fake.reclaim(machine.id)
    with pytest.raises(MachineGone):
        reactor.call(ws.host.run, "true", timeout=60)
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=60)
    assert fake.alive() == []


def test_an_instance_in_error_is_launch_failed(reactor: Reactor, cloud: Any, fake: FakeShadeform) -> None:
    fake.launch_answers = ["fail"]
    n = name()
    with pytest.raises(LaunchAmbiguous) as info:
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert info.value.code is Code.LAUNCH_FAILED
    reactor.call(cloud.delete, n, "", timeout=60)
    assert fake.alive() == []


def test_an_unknown_answer_is_reconciled_by_name_and_tag_and_spares_a_namesake(
        reactor: Reactor, cloud: Any, fake: FakeShadeform) -> None:
    n = name()
    fake.foreign(n)  # someone's instance with our name, without our tags: never adopted
    fake.create_500_made = 1
    with pytest.raises(LaunchAmbiguous):
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert fake.alive() == [n, n]
    reactor.call(cloud.delete, n, "", timeout=60)
    assert fake.alive() == [n]  # the namesake
    assert [i["tags"] for i in fake.instances.values() if not i["_ended"]] == [["team-b"]]


def test_the_answer_table() -> None:
    assert classify_create(401) is Code.GUARD
    assert classify_create(400, "A100_80G is not available in canada-1") is Code.NO_CAPACITY
    assert classify_create(400, "bad os") is Code.LAUNCH_FAILED
    assert classify_create(500) is None
    assert classify_create(409) is None  # undocumented: ambiguous
    deleting = seen_instance({"id": "x", "name": "n", "tags": ["actor-run-name=n"], "status": "deleting",
                              "status_details": "preempted"})
    assert (deleting.state, deleting.taken, deleting.name) == ("failed", True, "n")
    assert seen_instance({"id": "x", "name": "n", "tags": [], "status": "active"}).name == ""
    assert seen_instance({"id": "x", "name": "n", "status": "active", "ip": "", "ssh_port": 22}).state == "pending"
