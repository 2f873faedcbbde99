"""The fixtures the skypilot cloud's tests (test_skypilot.py, test_skypilot_real.py) share: moto's
EC2 on loopback (the session's server, reset for each test, dummy AWS credentials) and a fake `sky`
whose clusters are real sshd logins. A module that defines its own `fake` uses its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.moto_ec2 import MotoEc2
from fakes.moto_server import MotoServer
from fakes.sky import FakeSky, aws_env, power_off
from support.sshd import Sshd


@pytest.fixture(scope="module")
def moto_server(moto: MotoServer) -> Iterator[MotoEc2]:
    with MotoEc2(moto) as server:
        yield server


@pytest.fixture
def ec2(moto_server: MotoEc2, monkeypatch: pytest.MonkeyPatch) -> MotoEc2:
    for k, v in aws_env().items():
        monkeypatch.setenv(k, v)
    moto_server.reset()
    return moto_server


@pytest.fixture
def fake(tmp_path: Path, sshd: Sshd, ec2: MotoEc2) -> Iterator[FakeSky]:
    fake = FakeSky(tmp_path / "sky", address=sshd.address, ec2_endpoint=ec2.endpoint, root=tmp_path / "root",
                   sshd_pidfile=sshd.dir / "sshd.pid")
    yield fake
    fake.stop()  # its skylets and their jobs
    power_off(tmp_path / "root")  # its instances are terminated: nothing runs on them any more
