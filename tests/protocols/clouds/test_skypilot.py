"""The skypilot cloud against a fake `sky` (tests/fakes/sky.py: the contract's CLI grammar, request
ids and JSON) whose clusters are logins on a real sshd and whose instances live in a moto EC2 server."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from fakes.moto_ec2 import MotoEc2
from fakes.sky import FakeSky
from support.sshd import Sshd, free_port

from actor_run.protocols.clouds import known_clouds, parse_settings
from actor_run.protocols.clouds.skypilot import SkyPilotCloud
from actor_run.protocols.failures import (
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchRefused,
    MachineGone,
    Refused,
    SpecError,
)
from actor_run.protocols.hosts.aio import open_asyncio_loop
from actor_run.protocols.messages import Offer
from actor_run.protocols.names import PREFIX, encode_name
from actor_run.protocols.specs import CandidateSpec, load_batch

T = TypeVar("T")




def settings(tmp_path: Path, sshd: Sshd, fake: FakeSky, **kw: Any) -> dict[str, Any]:
    return {
        "sky": str(fake.command), "infra": "aws/us-east-1", "ssh_key": str(sshd.user_key), "ssh_user": sshd.user,
        "ssh_port": sshd.port, "root": str(tmp_path / "root"), "ec2_endpoint": fake.ec2_endpoint, "poll_s": 0.1,
        "cli_timeout_s": 15, "down_timeout_s": 5, "regions": ["us-east-1"],
        "deadline_command": f"echo {{minutes}} > {tmp_path / 'shutdown-minutes'}", **kw,
    }


def cloud(tmp_path: Path, sshd: Sshd, fake: FakeSky, **kw: Any) -> SkyPilotCloud:
    return SkyPilotCloud(parse_settings("skypilot", settings(tmp_path, sshd, fake, **kw)), tmp_path / "state")


def run(fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        async with open_asyncio_loop():
            return await fn()

    try:
        return trio.run(main)
    except BaseExceptionGroup as group:  # the loop's nursery wraps what the call raised
        while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
            group = group.exceptions[0]  # type: ignore[assignment]
        raise group from None


def name(attempt: int = 0, minutes: float = 30) -> str:
    return encode_name("sky", 1, attempt, "0123abcd", time.time() + minutes * 60)


OFFER = Offer(cloud="skypilot", region="us-east-1", gpu="A10G", hourly_usd=1.006)


def test_a_cluster_is_launched_pinned_reached_over_ssh_and_deleted_with_proof(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    c = cloud(tmp_path, sshd, fake)
    n = name(minutes=30)

    async def go() -> tuple[list[Offer], str, str, str, str]:
        offers = await c.offers(CandidateSpec(cloud="skypilot", gpu="A10G"), 0)
        machine = await c.launch(offers[0], n, time.time() + 30 * 60)
        ws = await c.connect(machine)
        res = await ws.host.run("echo hello from $(hostname)")  # type: ignore[attr-defined]
        behavior = ec2.shutdown_behavior(machine.id.split("/")[1])
        pinned = (tmp_path / "state" / "skypilot" / "known_hosts" / n).read_text()
        await c.delete(machine.name, machine.id)
        await c.aclose()
        return offers, res.text(), behavior, machine.address, pinned

    offers, out, behavior, address, pinned = run(go)
    # the price SkyPilot reports for that GPU there is the offer's (and so the meter's)
    assert [(o.region, o.hourly_usd) for o in offers] == [("us-east-1", 1.006)]
    assert out.startswith("hello from")
    assert address == sshd.address
    assert behavior == "terminate"  # read back through describe-instance-attribute
    # its own shutdown is scheduled a minute before the deadline, in whole minutes
    assert int((tmp_path / "shutdown-minutes").read_text()) in (28, 29)
    launch = next(c for c in fake.calls() if c.startswith("launch"))
    for flag in ("--async", "--down", "-i 15", "--infra aws/us-east-1", "--gpus A10G:1", "--no-use-spot"):
        assert flag in launch
    assert "-r" not in launch.split()  # the walk is ours
    assert "--retry-until-up" not in launch
    # the host key was pinned in a file of that cluster's own, gone with it
    assert pinned.startswith("[127.0.0.1]:")
    assert not (tmp_path / "state" / "skypilot" / "known_hosts" / n).exists()
    assert fake.clusters() == {}
    assert ec2.live() == []
    assert [i["State"]["Name"] for i in ec2.instances()] == ["terminated"]


def test_resources_unavailable_is_no_capacity_and_leaves_nothing(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    fake.set_faults(unavailable=["us-east-1"])
    c = cloud(tmp_path, sshd, fake)
    with pytest.raises(LaunchRefused) as info:
        run(lambda: c.launch(OFFER, name(), time.time() + 1800))
    assert info.value.code == Code.NO_CAPACITY
    assert "ResourcesUnavailableError" in str(info.value)
    assert fake.clusters() == {}
    assert ec2.instances() == []


def test_a_failed_provision_is_launch_failed_after_the_cluster_is_torn_down(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    fake.set_faults(provision="fail")
    c = cloud(tmp_path, sshd, fake)
    with pytest.raises(LaunchRefused) as info:
        run(lambda: c.launch(OFFER, name(), time.time() + 1800))
    assert info.value.code == Code.LAUNCH_FAILED
    assert "torn down" in str(info.value)
    assert not isinstance(info.value, LaunchAmbiguous)
    assert fake.clusters() == {}  # `--down` does not apply to a failed launch: our sky down did it
    assert ec2.live() == []
    assert len(ec2.instances()) == 1  # it had made one


@pytest.mark.parametrize("fault", ["never", "hang"])
def test_a_launch_that_never_finishes_or_a_hung_sky_is_ambiguous_and_its_request_cancelled(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, fault: str) -> None:
    fake.set_faults(launch=fault)
    c = cloud(tmp_path, sshd, fake, launch_timeout_s=1.5, cli_timeout_s=4)
    with pytest.raises(LaunchAmbiguous) as info:
        run(lambda: c.launch(OFFER, name(), time.time() + 1800))
    assert info.value.code == Code.AMBIGUOUS_CREATE
    assert [r["status"] for r in fake.db()["requests"]] == ["CANCELLED"]


@pytest.mark.parametrize("fault", ["hang", "fail"])
def test_when_sky_down_hangs_or_fails_ec2_terminates_the_instance(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2, fault: str) -> None:
    c = cloud(tmp_path, sshd, fake, cli_timeout_s=4)
    n = name()

    async def go() -> None:
        machine = await c.launch(OFFER, n, time.time() + 1800)
        assert len(ec2.live()) == 1
        fake.set_faults(down=fault)
        await c.delete(machine.name, machine.id)

    run(go)
    assert ec2.live() == []
    assert [i["State"]["Name"] for i in ec2.instances()] == ["terminated"]
    assert n in fake.clusters()  # SkyPilot still lists it: EC2's answer is the proof


def test_without_proof_from_either_the_delete_is_unconfirmed(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    c = cloud(tmp_path, sshd, fake, cli_timeout_s=4)
    n = name()
    machine = run(lambda: c.launch(OFFER, n, time.time() + 1800))
    fake.set_faults(down="fail")
    # EC2 cannot be reached either: nothing proves the instance is gone
    blind = cloud(tmp_path, sshd, fake, cli_timeout_s=4, ec2_endpoint=f"http://127.0.0.1:{free_port()}",
                  ec2_timeout_s=1)
    with pytest.raises(DeleteUnconfirmed):
        run(lambda: blind.delete(machine.name, machine.id))
    assert len(ec2.live()) == 1
    fake.set_faults()
    run(lambda: c.delete(machine.name, machine.id))
    assert ec2.live() == []


def test_a_cluster_skypilot_forgot_is_listed_by_tag_and_terminated(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    c = cloud(tmp_path, sshd, fake)
    n = name()
    run(lambda: c.launch(OFFER, n, time.time() + 1800))
    fake.forget(n)  # its record vanishes; its instance runs on
    fresh = cloud(tmp_path, sshd, fake)  # another process: knows nothing of it but the name prefix
    listed = run(lambda: fresh.list_ours(PREFIX))
    assert [(m.name, m.region) for m in listed] == [(n, "us-east-1")]
    assert listed[0].id.startswith("us-east-1/i-")
    run(lambda: fresh.delete(listed[0].name, listed[0].id))
    assert ec2.live() == []
    assert run(lambda: fresh.list_ours(PREFIX)) == []


def test_the_example_batch_file_loads_and_its_settings_parse() -> None:
    batch = load_batch(Path(__file__).resolve().parents[3] / "examples" / "skypilot.toml", known_clouds())
    jobs = batch.jobs()
    assert [c.regions for c in jobs[0].candidates] == [["us-east-1"], ["us-west-2", "us-east-2"]]
    parsed = parse_settings("skypilot", jobs[0].clouds["skypilot"])
    assert (parsed.infra, parsed.use_spot, parsed.sky) == ("aws/us-east-1", False, "sky")


def test_settings_are_checked() -> None:
    with pytest.raises(SpecError, match="infra"):
        SkyPilotCloud(parse_settings("skypilot", {"infra": "gcp/us-central1"}), Path("/nonexistent"))
    with pytest.raises(SpecError, match="unknown"):
        parse_settings("skypilot", {"zone": "x"})
    with pytest.raises(SpecError, match=r"clouds\.skypilot\.sky: no-such-sky was not found"):
        SkyPilotCloud(parse_settings("skypilot", {"sky": "no-such-sky --flag"}), Path("/nonexistent"))


def test_a_head_whose_spot_instance_was_taken_back_is_preempted(
        tmp_path: Path, sshd: Sshd, fake: FakeSky, ec2: MotoEc2) -> None:
    c = cloud(tmp_path, sshd, fake, use_spot=True)

    async def go() -> None:
        machine = await c.launch(OFFER, name(), time.time() + 1800)
        ws = await c.connect(machine)
        ec2.client().terminate_instances(InstanceIds=[machine.id.split("/")[1]])  # AWS takes it back
        sshd.stop()  # and with it the head's sshd
        with pytest.raises(MachineGone, match="spot instance reclaimed"):
            await ws.poll(f"{ws.root}/work/x/1/a0", 1, 0, 0)
        await c.delete(machine.name, machine.id)
        await c.aclose()

    run(go)
    assert "--use-spot" in next(c for c in fake.calls() if c.startswith("launch"))
    assert fake.clusters() == {}


def test_host_keys_are_pinned_per_cluster(tmp_path: Path, sshd: Sshd, fake: FakeSky) -> None:
    c = cloud(tmp_path, sshd, fake)
    first, second = name(0), name(1)

    async def go() -> None:
        a = await c.launch(OFFER, first, time.time() + 1800)
        ws_a = await c.connect(a)
        # a new machine at the same address (clouds reuse them) has another key: it is a new pin
        sshd.restart_with_new_host_key()
        b = await c.launch(OFFER, second, time.time() + 1800)
        ws_b = await c.connect(b)
        assert (await ws_b.host.run("true")).exit_code == 0  # type: ignore[attr-defined]
        # while the first cluster's pin holds: its key changed under it, which is refused
        with pytest.raises(Refused) as info:
            await ws_a.host.run("true")  # type: ignore[attr-defined]
        assert info.value.code == Code.GUARD
        for m in (a, b):
            await c.delete(m.name, m.id)
        await c.aclose()

    run(go)
    assert fake.clusters() == {}


def test_without_boto3_the_cloud_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # an import of it fails as if it were not installed
    with pytest.raises(SpecError, match=r"actor-run\[skypilot\]"):
        SkyPilotCloud(parse_settings("skypilot", {"sky": "true"}), tmp_path)


def test_a_delete_follows_its_down_request_to_its_end_and_asks_about_nothing_else(
        tmp_path: Path, sshd: Sshd, ec2: MotoEc2) -> None:
    fake = FakeSky(tmp_path / "sky", address=sshd.address, ec2_endpoint=ec2.endpoint, down_s=2.0)
    try:
        c = cloud(tmp_path, sshd, fake)
        machine = run(lambda: c.launch(OFFER, name(), time.time() + 1800))
        before = len(fake.argvs())
        run(lambda: c.delete(machine.name, machine.id))
        [down] = [r for r in fake.db()["requests"] if r["name"] == "sky.down"]
        assert down["status"] == "SUCCEEDED"
        calls = fake.argvs()[before:]
        # `Submitted sky.Terminating request: <id>` was read and that request followed until it ended
        assert ["api", "status", "-a", "-v", "-o", "json", down["request_id"]] in calls
        assert fake.clusters() == {}  # SkyPilot took it down: not left to EC2
        assert ec2.live() == []
        for argv in fake.argvs():  # only the requests we made, or one cluster's active ones
            if argv[:2] == ["api", "status"]:
                assert "-l" not in argv, argv
                assert "-c" in argv or argv[-1] != "json", argv  # a cluster's, or ids after the options
    finally:
        fake.stop()


def test_the_price_is_skypilots_for_exactly_that_gpu_and_never_zero(
        tmp_path: Path, sshd: Sshd, fake: FakeSky) -> None:
    c = cloud(tmp_path, sshd, fake, regions=["us-east-1"])

    async def go(cl: SkyPilotCloud, gpu: str) -> list[float]:
        return [o.hourly_usd for o in await cl.offers(CandidateSpec(cloud="skypilot", gpu=gpu), 0)]

    # `T4` also matches T4g ($0.42) in SkyPilot's case-insensitive filter; `A100-80G` is ours for A100-80GB
    assert run(lambda: go(c, "T4")) == [0.526]
    assert run(lambda: go(c, "L4")) == [0.8048]  # not L40S
    assert run(lambda: go(c, "A100")) == []  # not sold singly: no price, so not offered (not $0)
    priced = cloud(tmp_path, sshd, fake, fallback_hourly_usd=9.5)
    assert run(lambda: go(priced, "A100")) == [9.5]  # metered at the stated fallback
    assert any(argv[:2] == ["gpus", "list"] for argv in fake.argvs())  # not the deprecated show-gpus


def test_the_defaults_fit_a_real_sky() -> None:
    s = parse_settings("skypilot", {})
    assert s.cli_timeout_s >= 45  # each real call takes 5-15 s on a loaded machine
    assert s.fallback_hourly_usd is None
    with pytest.raises(SpecError, match="fallback_hourly_usd"):
        parse_settings("skypilot", {"fallback_hourly_usd": 0})
