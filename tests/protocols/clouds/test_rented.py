"""Every rented cloud against its fake provider on loopback (held to the vendor's OpenAPI
document, machines that are real sshd logins): launch, connect, verified delete, and each fault
the issue names, with the same assertions for every vendor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.keys import client_key
from fakes.openapi_server import OPENAPI, document
from fakes.providers import FAKES, rented_cloud, serve
from openapi_spec_validator import validate
from support.waits import poll

from actor_run.actors import Reactor
from actor_run.protocols.clouds import make_cloud
from actor_run.protocols.failures import Code, LaunchAmbiguous, LaunchRefused, MachineGone, SpecError
from actor_run.protocols.specs import CandidateSpec


@pytest.mark.parametrize("path", sorted(p for p in OPENAPI.iterdir() if p.suffix in (".json", ".yaml")), ids=str)
def test_each_vendors_document_is_valid_openapi(path: Path) -> None:
    """The documents the fakes are held to (the fakes skip this check: seconds each, in every
    test process)."""
    validate(document(path))


@pytest.fixture(params=sorted(FAKES))
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from serve(request.param, tmp_path)


@pytest.fixture
def cloud(fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return rented_cloud(fake, tmp_path, monkeypatch)


def name(n: int = 1, deadline: float | None = None) -> str:
    return f"ar-t-{n}-a0-0123abcd-d{int(deadline or time.time() + 3600)}"


def test_a_missing_key_names_the_variable(fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fake.KEY_VAR, raising=False)
    with pytest.raises(SpecError, match=fake.KEY_VAR):
        make_cloud(fake.CLOUD, {"ssh_key": str(client_key(tmp_path / "k"))}, tmp_path)


def test_a_machine_is_launched_connected_and_deleted_for_certain(reactor: Reactor, cloud: Any, fake: Any) -> None:
    n = name()
    offer = fake.sample_offer()
    machine = reactor.call(cloud.launch, offer, n, time.time() + 3600, timeout=30)
    assert machine.hourly_usd == offer.hourly_usd
    assert machine.region == offer.region
    ws = reactor.call(cloud.connect, machine, timeout=30)
    home = fake.boxes.boxes[machine.id].home
    assert ws.root == str(home / ".actor-run")  # the machine's own HOME, through ~
    assert (home / ".actor-run" / "deadline.sh").is_file()
    assert [m.name for m in reactor.call(cloud.list_ours, "ar-", timeout=30)] == [n]
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []
    assert reactor.call(cloud.list_ours, "ar-", timeout=30) == []


def test_no_stock_is_a_clean_no_capacity(reactor: Reactor, cloud: Any, fake: Any) -> None:
    fake.no_stock(fake.sample_offer().gpu)
    assert reactor.call(cloud.offers, CandidateSpec(cloud=fake.CLOUD, gpu=fake.sample_offer().gpu), 0,
                        timeout=30) == []
    with pytest.raises(LaunchRefused) as info:  # stock gone between the offer and the create
        reactor.call(cloud.launch, fake.sample_offer(), name(), time.time() + 3600, timeout=30)
    assert info.value.code is Code.NO_CAPACITY
    assert not isinstance(info.value, LaunchAmbiguous)
    assert fake.alive() == []


def test_a_create_answered_500_that_made_a_machine_is_found_by_name_and_deleted(
        reactor: Reactor, cloud: Any, fake: Any) -> None:
    with fake.lock:
        fake.create_500_made = 1
        fake.lag_reads = 2  # and the listing lags the create
    n = name()
    with pytest.raises(LaunchAmbiguous):
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=30)
    assert fake.alive() == [n]
    reactor.call(cloud.delete, n, "", timeout=30)  # by name: what the lease does after ambiguous_create
    assert fake.alive() == []
    assert [b[0] for b in fake.billed] == [n]


def test_a_429_is_waited_out_as_asked(reactor: Reactor, cloud: Any, fake: Any) -> None:
    fake.rate_limit(1, retry_after=1)
    t0 = time.monotonic()
    offers = reactor.call(cloud.offers, CandidateSpec(cloud=fake.CLOUD, gpu="A100-80G"), 0, timeout=30)
    assert offers
    assert time.monotonic() - t0 >= 1.0
    assert cloud.api.statistics().rate_limited == 1
    assert fake.rate_limited_sent == 1


def test_a_refused_key_is_guard(reactor: Reactor, cloud: Any, fake: Any) -> None:
    fake.token = "another-key"
    with pytest.raises(LaunchRefused) as info:
        reactor.call(cloud.offers, CandidateSpec(cloud=fake.CLOUD, gpu="A100-80G"), 0, timeout=30)
    assert info.value.code is Code.GUARD
    with pytest.raises(LaunchRefused) as info:
        reactor.call(cloud.launch, fake.sample_offer(), name(), time.time() + 3600, timeout=30)
    assert info.value.code is Code.GUARD
    assert fake.alive() == []


def test_a_machine_stuck_starting_is_launch_failed_and_deleted(reactor: Reactor, fake: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = rented_cloud(fake, tmp_path, monkeypatch, launch_timeout_s=0.5)
    fake.stuck = True
    n = name()
    with pytest.raises(LaunchAmbiguous) as info:
        reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=30)
    assert info.value.code is Code.LAUNCH_FAILED
    reactor.call(cloud.delete, n, "", timeout=30)
    assert fake.alive() == []


def test_a_delete_that_fails_once_is_verified_and_asked_again(reactor: Reactor, cloud: Any, fake: Any) -> None:
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=30)
    fake.delete_fail = 1
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []
    assert [s for _, _, s in fake.calls if s >= 500] == [500]


def test_a_machine_that_vanishes_is_machine_gone(reactor: Reactor, cloud: Any, fake: Any) -> None:
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=30)
    ws = reactor.call(cloud.connect, machine, timeout=30)
    fake.vanish(machine.id)
    with pytest.raises(MachineGone):
        reactor.call(ws.host.run, "true", timeout=30)
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []


@pytest.mark.parametrize("cloud", sorted(FAKES))
def test_the_example_batch_of_each_vendor_is_valid(cloud: str) -> None:
    from actor_run.protocols.clouds import known_clouds, parse_settings
    from actor_run.protocols.specs import load_batch

    example = Path(__file__).resolve().parents[3] / "examples" / f"{cloud}.toml"
    batch = load_batch(str(example), known_clouds())
    assert {c.cloud for c in batch.spec.candidates} == {cloud}
    assert parse_settings(cloud, batch.spec.clouds[cloud]).api_key_env == FAKES[cloud].KEY_VAR


def test_an_api_that_cannot_be_reached_refuses_the_create_cleanly(reactor: Reactor, fake: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from support.sshd import free_port

    cloud = rented_cloud(fake, tmp_path, monkeypatch, api_url=f"http://127.0.0.1:{free_port()}{fake.base_path}")
    with pytest.raises(LaunchRefused) as info:  # the request never left: nothing can have been made
        reactor.call(cloud.launch, fake.sample_offer(), name(), time.time() + 3600, timeout=30)
    assert info.value.code is Code.LAUNCH_FAILED
    assert not isinstance(info.value, LaunchAmbiguous)


# shadeform's own deadline is its auto_delete (test_shadeform.py), which would race an OS shutdown here
@pytest.mark.parametrize("fake", ["hyperstack", "lambda"], indirect=True)
def test_a_vm_shuts_itself_down_at_its_deadline(reactor: Reactor, cloud: Any, fake: Any) -> None:
    n = name(deadline=time.time() + 2)
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 2, timeout=30)
    ws = reactor.call(cloud.connect, machine, timeout=30)
    reactor.call(ws.aclose, timeout=30)
    asked = fake.boxes.boxes[machine.id].home / "shutdown-asked"  # the fake's shutdown_command leaves this
    poll(asked.exists, 30, "the machine's shutdown at its deadline", every=0.1)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []


def test_the_answer_tables_say_quota_for_an_exhausted_account() -> None:
    from actor_run.protocols.clouds import hyperstack, lambdacloud

    assert lambdacloud.classify_launch(400, "global/quota-exceeded") is Code.QUOTA
    assert lambdacloud.classify_launch(400, "instance-operations/launch/insufficient-capacity") is Code.NO_CAPACITY
    assert lambdacloud.classify_launch(502, "provider/internal-unavailable") is None  # ambiguous
    assert hyperstack.classify_create(400, {"status": False, "message": "Insufficient balance to create the resource"}
                                      ) is Code.QUOTA
    assert hyperstack.classify_create(200, {"status": False, "message": "no flavor stock"}) is Code.NO_CAPACITY
    assert hyperstack.classify_create(200, {"status": True}) is None
    assert hyperstack.classify_create(409, {"status": False}) is None  # our unique name exists: ours made it


# --- readiness: what the API calls ready is not yet what SSH answers ----------------------------------


@pytest.mark.parametrize("before", ["refuse", "drop", "silent"])
def test_ssh_that_opens_after_ready_is_waited_for(reactor: Reactor, fake: Any, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, before: str) -> None:
    """sshd opens 2 s after ready; meanwhile the port refuses, or takes TCP and closes it, or takes
    it and says nothing (one SSH try is then cut by connect_timeout_s): connect waits it out."""
    cloud = rented_cloud(fake, tmp_path, monkeypatch, connect_timeout_s=0.5)
    with fake.lock:
        fake.ssh_after_s, fake.guest_before = 2.0, before
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    assert machine.id in fake.boxes.guests, "the API said ready before the guest's sshd (as vendors do)"
    ws = reactor.call(cloud.connect, machine, timeout=60)
    assert reactor.call(ws.host.run, "echo up", timeout=30).stdout.strip() == b"up"
    if before != "refuse":
        assert fake.boxes.knocks[machine.id] >= 1  # it knocked before sshd was there, and came back
    known = (tmp_path / "state" / fake.CLOUD / "known_hosts.d" / n).read_text().split()
    box_key = (fake.boxes.boxes[machine.id].host_key.with_name("host_ed25519.pub")).read_text().split()
    assert known[1:3] == box_key[:2]  # the key pinned is the one of the sshd that let us in
    reactor.call(ws.aclose, timeout=30)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []


@pytest.mark.parametrize("fake", ["hyperstack"], indirect=True)
def test_a_port_filtered_until_its_firewall_rule_is_silent_then_answers(fake: Any) -> None:
    """Hyperstack: inbound SSH is closed until a port-22 rule exists (hyperstack.md §8): the
    fake's port takes TCP and says nothing until the rule is added."""
    import socket

    import httpx

    client = httpx.Client(base_url=fake.url, headers={"api_key": fake.token}, timeout=60)
    client.post("/core/environments", json={"name": "e", "region": "NORWAY-1"})
    client.post("/core/keypairs", json={"name": "k", "environment_name": "e", "public_key": "ssh-ed25519 AAAA k"})
    made = client.post("/core/virtual-machines", json={"name": "vm", "environment_name": "e", "count": 1,
                                                       "flavor_name": "n3-A100x1", "key_name": "k"}).json()
    vm = made["instances"][0]["id"]
    address = fake.vms[vm]["_address"]
    with socket.create_connection((address, fake.port), timeout=5) as s:
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):  # accepted, and not a byte: no banner behind a closed firewall
            s.recv(1)
    rule = {"direction": "ingress", "protocol": "tcp", "ethertype": "IPv4", "remote_ip_prefix": "0.0.0.0/0",
            "port_range_min": fake.port, "port_range_max": fake.port, "virtual_machine_id": vm}
    assert client.post(f"/core/virtual-machines/{vm}/sg-rules", json=rule).status_code == 200
    with pytest.raises(ConnectionRefusedError):  # open now, and nothing listens yet (still BUILD)
        socket.create_connection((address, fake.port), timeout=5).close()
    client.close()


def test_ssh_that_never_opens_fails_at_launch_timeout(reactor: Reactor, fake: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from actor_run.protocols.failures import Unreachable

    cloud = rented_cloud(fake, tmp_path, monkeypatch, launch_timeout_s=4.0)
    with fake.lock:
        fake.ssh_after_s = 3600.0
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    with pytest.raises(Unreachable, match="launch_timeout_s = 4 s"):
        reactor.call(cloud.connect, machine, timeout=60)
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []


def test_our_key_refused_ends_the_wait_at_once(reactor: Reactor, fake: Any, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an authentication refusal (with the key the create carried) ends the wait before
    launch_timeout_s: 600 s here, and the call is given 60."""
    from actor_run.protocols.failures import Refused

    other = client_key(tmp_path / "other").with_name("id_ed25519.pub").read_text()
    cloud = rented_cloud(fake, tmp_path, monkeypatch, launch_timeout_s=600.0)
    fake.boxes.foreign_key = other
    n = name()
    machine = reactor.call(cloud.launch, fake.sample_offer(), n, time.time() + 3600, timeout=60)
    with pytest.raises(Refused) as info:
        reactor.call(cloud.connect, machine, timeout=60)
    assert info.value.code is Code.LAUNCH_FAILED
    assert not (tmp_path / "state" / fake.CLOUD / "known_hosts.d" / n).exists() or \
        (tmp_path / "state" / fake.CLOUD / "known_hosts.d" / n).read_text() == ""  # no login: nothing pinned
    reactor.call(cloud.delete, n, machine.id, timeout=30)
    assert fake.alive() == []


# --- Lambda file systems: offers only where the file system lives ------------------------------------


@pytest.mark.parametrize("fake", ["lambda"], indirect=True)
def test_a_lambda_file_system_limits_offers_to_its_region(reactor: Reactor, fake: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake.file_systems["shared"] = "us-west-1"
    cloud = rented_cloud(fake, tmp_path, monkeypatch, file_system="shared")
    reactor.call(cloud.check, timeout=60)
    offers = reactor.call(cloud.offers, CandidateSpec(cloud="lambda", gpu="A100-80G"), 0, timeout=60)
    assert {o.region for o in offers} == {"us-west-1"}  # us-east-1 has stock too, and no file system
    reactor.call(cloud.offers, CandidateSpec(cloud="lambda", gpu="H100"), 0, timeout=60)
    assert [c for c in fake.calls if c[1] == "/api/v1/file-systems"] == [("GET", "/api/v1/file-systems", 200)]
    n = name()
    machine = reactor.call(cloud.launch, offers[0], n, time.time() + 3600, timeout=60)
    assert machine.region == "us-west-1"
    reactor.call(cloud.delete, n, machine.id, timeout=30)


@pytest.mark.parametrize("fake", ["lambda"], indirect=True)
def test_a_missing_lambda_file_system_is_bad_input(reactor: Reactor, fake: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake.file_systems["shared"] = "us-west-1"
    cloud = rented_cloud(fake, tmp_path, monkeypatch, file_system="sharde")
    with pytest.raises(SpecError) as info:
        reactor.call(cloud.check, timeout=60)
    assert info.value.field == "clouds.lambda.file_system"
    assert "shared" in str(info.value)
