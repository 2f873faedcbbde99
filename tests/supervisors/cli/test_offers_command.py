"""supervisors/cli/offers.py: `actor-run offers` (issue 29.5) through the real command line: the
sim's and a fake rented provider's offers, cheapest first with stock, read-only, no local SSH key;
and `clouds check` on every cloud without one."""

from __future__ import annotations

import json
from pathlib import Path

from fakes.batch_kit import cli
from fakes.runpod import FakeRunPod


def test_offers_lists_the_sim_cheapest_first_with_stock(tmp_path: Path) -> None:
    done = cli(tmp_path, "offers", key_var="UNRELATED")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["CLOUD", "REGION", "GPU", "$/H", "STOCK", "KIND"]
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
