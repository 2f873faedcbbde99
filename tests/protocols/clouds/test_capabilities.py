"""protocols/clouds/capabilities.py: each registered cloud declares the optional capabilities it
has (and no other), and nothing in the product probes a cloud with getattr/hasattr any more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from actor_run.protocols.clouds import (
    Booting,
    CacheAttaching,
    Caching,
    Cataloged,
    Checking,
    LaunchChecking,
    MachineChecking,
    PassingOver,
    Reclaiming,
    SellsGpus,
    SSHLogin,
    known_clouds,
    make_cloud,
)

CAPABILITIES = (Booting, CacheAttaching, Caching, Cataloged, Checking, LaunchChecking, MachineChecking, PassingOver,
                Reclaiming, SellsGpus, SSHLogin)
RENTED_VM = {Booting, Cataloged, LaunchChecking, SSHLogin, MachineChecking}
# what each cloud can do beyond the Cloud protocol: the table in capabilities.py's docstring
HAS: dict[str, set[type]] = {
    "local": {MachineChecking, Cataloged},
    "sim": {Cataloged, MachineChecking, SellsGpus},
    "ssh": {SSHLogin, MachineChecking},
    "skypilot": {MachineChecking},
    "runpod-serverless": {Reclaiming},
    "runpod": RENTED_VM | {Caching},
    "hyperstack": RENTED_VM | {Caching, CacheAttaching, PassingOver},
    "lambda": RENTED_VM | {Checking, Caching, PassingOver},
    "vastai": RENTED_VM,
    "shadeform": RENTED_VM,
}
# the least each cloud's constructor needs (nothing here talks to a provider)
SETTINGS: dict[str, dict[str, str]] = {"skypilot": {"sky": "/bin/true"}, "runpod-serverless": {"image": "i"}}
ROOT = Path(__file__).resolve().parents[3]


def test_the_table_names_every_registered_cloud() -> None:
    assert set(HAS) == known_clouds()


@pytest.mark.parametrize("name", sorted(HAS))
def test_each_cloud_has_the_capabilities_it_declares(name: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RUNPOD_API_KEY", "LAMBDA_API_KEY", "HYPERSTACK_API_KEY", "VAST_API_KEY", "SHADEFORM_API_KEY"):
        monkeypatch.setenv(var, "test-key")
    cloud = make_cloud(name, SETTINGS.get(name, {}), tmp_path)
    try:
        assert {c for c in CAPABILITIES if isinstance(cloud, c)} == HAS[name]
        # declared, not happened upon: a cloud that has a capability names it among its bases
        assert {c for c in CAPABILITIES if c in type(cloud).__mro__} == HAS[name]
    finally:
        trio.run(cloud.aclose)


def test_a_booting_cloud_says_so() -> None:
    from actor_run.protocols.clouds.rented import RentedCloud

    assert RentedCloud.boots is True


def test_nothing_probes_a_cloud_with_getattr() -> None:
    probe = re.compile(r"getattr\(.*cloud|hasattr\(.*cloud")
    found = [f"{p.relative_to(ROOT)}:{i}" for layer in ("protocols", "actors", "supervisors", "tests")
             for p in sorted((ROOT / layer).rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert found == [], found
