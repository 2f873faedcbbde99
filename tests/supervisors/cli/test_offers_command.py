"""supervisors/cli/offers.py: `actor-run offers` (issue 29.5) through the real command line: the
sim's and a fake rented provider's offers, cheapest first with stock, read-only, no local SSH key;
and `clouds check` on every cloud without one."""

from __future__ import annotations

import json
from pathlib import Path

from fakes.batch_kit import cli
from fakes.runpod import FakeRunPod
from fakes.sky import FakeSky


def test_offers_lists_the_sim_cheapest_first_with_stock(tmp_path: Path) -> None:
    done = cli(tmp_path, "offers", key_var="UNRELATED")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["CLOUD", "REGION", "GPU", "$/H", "STOCK", "KIND", "INTERRUPTIBLE", "IMAGE"]
    rows = [line.split() for line in lines[1:]]
    assert rows[0][:2] == ["local", "this-computer"]
    sim = [r for r in rows if r[0] == "sim"]
    assert [float(r[3]) for r in sim] == sorted(float(r[3]) for r in sim)
    assert ["sim", "ap-south", "A100", "1.5000", "2"] in [r[:5] for r in sim]
    assert "not asked: runpod: set the environment variable RUNPOD_API_KEY" in done.stderr
    picked = cli(tmp_path, "offers", "--gpu", "H100", "--max-price", "3", "--json", key_var="UNRELATED")
    assert picked.returncode == 0, picked.stderr
    offers = [json.loads(line) for line in picked.stdout.splitlines()]
    assert [(o["cloud"], o["region"], o["gpu"], o["hourly_usd"], o["stock"]) for o in offers] == [
        ("sim", "us-east", "H100", 2.9, "4")]


def test_offers_and_clouds_check_of_a_rented_cloud_need_no_local_ssh_key(tmp_path: Path) -> None:
    server = FakeRunPod(tmp_path / "fake").start()
    try:
        server.no_stock("H100")
        user = tmp_path / "user.toml"  # an ssh_key that does not exist: read-only calls never read it
        user.write_text(f'[clouds.runpod]\napi_url = "{server.url}"\nssh_key = "{tmp_path}/no-such-key"\n')
        done = cli(tmp_path, "offers", "--cloud", "runpod", "--config", str(user), key_var=server.KEY_VAR)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = [line.split() for line in done.stdout.splitlines()[1:]]
        assert rows, done.stdout
        assert {r[0] for r in rows} == {"runpod"}
        assert "H100" not in {r[2] for r in rows}  # out of stock
        prices = [float(r[3]) for r in rows]
        assert prices == sorted(prices)
        assert all(r[4] in ("high", "medium", "low") for r in rows)
        check = cli(tmp_path, "clouds", "check", "runpod", "--config", str(user), key_var=server.KEY_VAR)
        assert check.returncode == 0, check.stdout + check.stderr
        assert "the key works" in check.stdout
        assert {m for m, _, _ in server.calls} == {"GET"}  # nothing made
    finally:
        server.stop()
    assert server.violations == []


def test_offers_of_a_cloud_without_its_key_names_the_variable(tmp_path: Path) -> None:
    done = cli(tmp_path, "offers", "--cloud", "lambda", key_var="UNRELATED")
    assert done.returncode == 2
    assert "LAMBDA_API_KEY" in done.stderr


def test_clouds_check_covers_every_cloud(tmp_path: Path) -> None:
    done = cli(tmp_path, "clouds", "check", key_var="UNRELATED")
    for name in ("hyperstack", "lambda", "local", "runpod", "runpod-serverless", "sim", "skypilot", "ssh"):
        assert f"{name}:" in done.stdout.splitlines(), done.stdout
    sim = cli(tmp_path, "clouds", "check", "sim", key_var="UNRELATED")
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert "in stock in us-east" in sim.stdout
    assert "not configured (no [clouds.skypilot] table" in done.stdout


def test_offers_of_the_ssh_cloud_list_each_configured_host(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"  # nothing is connected to: the hosts are listed from the config
    user.write_text('[clouds.ssh.hosts.box]\naddress = "127.0.0.1"\nslots = 2\n'
                    '[clouds.ssh.hosts.gpu2]\naddress = "127.0.0.2"\n')
    table = cli(tmp_path, "offers", "--cloud", "ssh", "--config", str(user), key_var="UNRELATED")
    assert table.returncode == 0, table.stderr
    assert [line.split() for line in table.stdout.splitlines()] == [
        ["CLOUD", "REGION", "GPU", "$/H", "STOCK", "KIND", "INTERRUPTIBLE", "IMAGE"],
        ["ssh", "box", "-", "0.0000", "-", "-", "-", "-"], ["ssh", "gpu2", "-", "0.0000", "-", "-", "-", "-"]]
    every = cli(tmp_path, "offers", "--json", "--config", str(user), key_var="UNRELATED")
    assert every.returncode == 0, every.stderr
    offers = [json.loads(line) for line in every.stdout.splitlines()]
    assert [(o["cloud"], o["host"], o["hourly_usd"]) for o in offers if o["cloud"] == "ssh"] == [
        ("ssh", "box", 0.0), ("ssh", "gpu2", 0.0)]
    assert {o["cloud"] for o in offers} == {"local", "sim", "ssh"}
    # its hosts name no GPU class: under --gpu they are not offered as one, and the note says why
    h100 = cli(tmp_path, "offers", "--gpu", "H100", "--json", "--config", str(user), key_var="UNRELATED")
    assert h100.returncode == 0, h100.stderr
    assert {json.loads(line)["cloud"] for line in h100.stdout.splitlines()} == {"sim"}
    assert "not asked: ssh: its hosts declare no GPU class, so none is offered as H100" in h100.stderr
    only = cli(tmp_path, "offers", "--cloud", "ssh", "--gpu", "H100", "--config", str(user), key_var="UNRELATED")
    assert (only.returncode, only.stdout) == (2, "")
    assert only.stderr.startswith("actor-run: ssh: its hosts declare no GPU class")


def test_offers_of_skypilot_are_its_catalogs_prices_and_say_what_a_question_lacks(tmp_path: Path) -> None:
    sky = FakeSky(tmp_path / "sky", address="127.0.0.1", ec2_endpoint="")  # its catalog only: nothing is made
    user = tmp_path / "user.toml"
    user.write_text(f'[clouds.skypilot]\nsky = "{sky.command}"\ninfra = "aws/us-east-1"\n')
    found = cli(tmp_path, "offers", "--cloud", "skypilot", "--gpu", "A10G", "--region", "us-west-2", "--json",
                "--config", str(user), key_var="UNRELATED")
    assert found.returncode == 0, found.stderr
    # the cheapest g5 with one A10G in SkyPilot's AWS catalog
    assert [json.loads(line) for line in found.stdout.splitlines()] == [
        {"cloud": "skypilot", "region": "us-west-2", "gpu": "A10G", "hourly_usd": 1.006, "candidate": 0, "host": "",
         "account": "", "kind": "", "stock": "", "image": "", "cache": "", "cache_path": "", "interruptible": False,
         "interruptible_usd": 0.0, "spend_cap_usd": 0.0}]
    table = cli(tmp_path, "offers", "--cloud", "skypilot", "--gpu", "T4", "--config", str(user),
                key_var="UNRELATED")  # the region of clouds.skypilot.infra
    assert table.returncode == 0, table.stderr
    assert [line.split() for line in table.stdout.splitlines()][1:] == [
        ["skypilot", "us-east-1", "T4", "0.5260", "-", "-", "-", "-"]]
    assert sky.calls() == ["gpus list A10G:1 --infra aws/us-west-2 -o json",
                           "gpus list T4:1 --infra aws/us-east-1 -o json"]  # read-only
    no_gpu = cli(tmp_path, "offers", "--cloud", "skypilot", "--config", str(user), key_var="UNRELATED")
    assert (no_gpu.returncode, no_gpu.stdout) == (2, "")
    assert no_gpu.stderr == ("actor-run: skypilot: SkyPilot's catalog is asked for one GPU class at a time: name one "
                             "with --gpu (for example --gpu A10G)\n")
    user.write_text(f'[clouds.skypilot]\nsky = "{sky.command}"\n')  # infra = "aws": no region
    no_region = cli(tmp_path, "offers", "--gpu", "T4", "--config", str(user), key_var="UNRELATED")
    assert no_region.returncode == 0, no_region.stderr  # the others answer
    assert "not asked: skypilot: SkyPilot's catalog is asked for one region at a time: name one with --region" in (
        no_region.stderr)
    assert len(sky.calls()) == 2  # not asked


def test_offers_of_vast_and_shadeform_show_on_demand_and_interruptible_prices_side_by_side(tmp_path: Path) -> None:
    from fakes.shadeform import FakeShadeform
    from fakes.vastai import FakeVast

    vast, shade = FakeVast(tmp_path / "vast").start(), FakeShadeform(tmp_path / "shade").start()
    try:
        user = tmp_path / "user.toml"
        user.write_text(f'[clouds.vastai]\napi_url = "{vast.url}"\n[clouds.shadeform]\napi_url = "{shade.url}"\n')
        import os

        from support.cli_inproc import run_cli

        env = {**os.environ, "VAST_API_KEY": "test-key", "SHADEFORM_API_KEY": "test-key"}
        state = ["--state-dir", str(tmp_path / "state"), "--config", str(user)]
        done = run_cli(["offers", "--cloud", "vastai", "--cloud", "shadeform", "--gpu", "A100-80G", *state],
                       env=env, cwd=tmp_path, timeout=120)
        bids = run_cli(["offers", "--cloud", "vastai", "--gpu", "A100-80G", "--interruptible", "--json", *state],
                       env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = {(r[0], r[5]): r for r in (line.split() for line in done.stdout.splitlines()[1:])}
        assert rows[("vastai", "24817000")][3:4] + rows[("vastai", "24817000")][6:7] == ["1.1200", "0.4700"]
        assert rows[("shadeform", "hyperstack/A100_80G")][6] in ("1.1000", "-")  # canada-1 sells spot, norway-1 not
        assert rows[("shadeform", "lambdalabs/A100_80G")][6] == "-"
        assert bids.returncode == 0, bids.stdout + bids.stderr
        offers = [json.loads(line) for line in bids.stdout.splitlines()]
        assert offers
        assert all(o["interruptible"] for o in offers)
        assert offers[0]["hourly_usd"] == 0.495  # min_bid 0.45 and the 10 % margin
        assert {m for m, _, _ in shade.calls} == {"GET"}
        assert {(m, t) for m, t, _ in vast.calls if m != "GET"} <= set(FakeVast.SEARCHES)
    finally:
        vast.stop()
        shade.stop()
    assert vast.violations == shade.violations == []
