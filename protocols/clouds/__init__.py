"""Clouds: the Cloud protocol and one module per provider; `make_cloud` builds one from settings.

Accounts: a cloud's settings may hold `accounts = { <name> = { ... } }` (`[clouds.runpod.accounts.
team-b]` in a batch file): each is the same provider reached with other settings (its own
`api_key_env`, any other field overriding the cloud's). One Cloud object serves one account; it is
named by its *key*: the cloud's name for its own settings (account "" or "main"), `<cloud>@<account>`
for the others. Ledger rows and sweeps name clouds by key, so every account is listed and swept.

A cloud's optional capabilities (boot stages, GPU and region names, checks before a run, a login
shell, reclaiming quota) are runtime-checkable protocols in capabilities.py, asked with isinstance.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.clouds.base import Cloud
from actor_run.protocols.clouds.capabilities import (
    Booting,
    CacheAttaching,
    Caching,
    Cataloged,
    Checking,
    LaunchChecking,
    MachineChecking,
    PassingOver,
    Reclaim,
    Reclaiming,
    SellsGpus,
    SSHLogin,
)
from actor_run.protocols.clouds.gpus import gpu_memory_gb
from actor_run.protocols.clouds.verify import MachineCheck, verify_machine
from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import CandidateSpec, add_secret_settings, check_candidates, spec_error

# name -> (module, settings struct, cloud class)
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "local": ("actor_run.protocols.clouds.local", "LocalSettings", "LocalCloud"),
    "runpod-serverless": ("actor_run.protocols.clouds.runpod_serverless", "ServerlessSettings", "ServerlessCloud"),
    "sim": ("actor_run.protocols.clouds.sim", "SimSettings", "SimCloud"),
    "skypilot": ("actor_run.protocols.clouds.skypilot", "SkyPilotSettings", "SkyPilotCloud"),
    "ssh": ("actor_run.protocols.clouds.ssh", "SSHSettings", "SSHCloud"),
    "runpod": ("actor_run.protocols.clouds.runpod", "RunPodSettings", "RunPodCloud"),
    "lambda": ("actor_run.protocols.clouds.lambdacloud", "LambdaSettings", "LambdaCloud"),
    "hyperstack": ("actor_run.protocols.clouds.hyperstack", "HyperstackSettings", "HyperstackCloud"),
    # issue 45: the marketplace (Vast bids) and the many clouds behind Shadeform
    "vastai": ("actor_run.protocols.clouds.vastai", "VastSettings", "VastCloud"),
    "shadeform": ("actor_run.protocols.clouds.shadeform", "ShadeformSettings", "ShadeformCloud"),
}


INTERRUPTIBLE = frozenset({"vastai", "shadeform"})  # clouds whose candidates may say `interruptible = true`
MAIN = "main"  # the account that is the cloud's own settings (unless `accounts.main` says otherwise)


def known_clouds() -> set[str]:
    return set(_REGISTRY)


def check_cloud_names(candidates: list[CandidateSpec], tables: Iterable[str]) -> None:
    """A job's cloud names, checked where clouds are built (specs.py knows no registry): each
    candidate's cloud and each `[clouds.<name>]` table must be a known cloud; a SpecError names the
    field (`candidates[1].cloud`, `clouds.nimbus`)."""
    known = known_clouds()
    check_candidates(candidates, known)
    for i, c in enumerate(candidates):  # issue 45: interruptible capacity is sold where a cloud says so
        if c.interruptible and c.cloud not in INTERRUPTIBLE:
            raise SpecError(f"candidates[{i}].interruptible", f"{c.cloud} sells no interruptible capacity here "
                            f"(clouds that do: {', '.join(sorted(INTERRUPTIBLE))})")
        if c.max_bid_usd is not None and not (c.interruptible and c.cloud == "vastai"):
            raise SpecError(f"candidates[{i}].max_bid_usd", "a bid is for a vastai candidate with interruptible = true")
    for name in tables:
        if name not in known:
            raise SpecError(f"clouds.{name}", f"unknown cloud (known: {', '.join(sorted(known))})")


def cloud_key(cloud: str, account: str = "") -> str:
    """How the Runner, the ledger and sweeps name one account of a cloud."""
    return cloud if account in ("", MAIN) else f"{cloud}@{account}"


def split_key(key: str) -> tuple[str, str]:
    """(cloud, account) of a cloud key; the account is "" for the cloud's own settings."""
    cloud, _, account = key.partition("@")
    return cloud, account


def accounts_of(raw: dict[str, Any]) -> list[str]:
    """Every account a cloud's settings name, the cloud's own ("") first."""
    return ["", *sorted(a for a in raw.get("accounts", {}) if a != MAIN)]


def account_settings(name: str, raw: dict[str, Any], account: str) -> dict[str, Any]:
    """The settings of one account: the cloud's, with the account's table over them."""
    accounts = raw.get("accounts", {})
    if not isinstance(accounts, dict) or not all(isinstance(v, dict) for v in accounts.values()):
        raise SpecError(f"clouds.{name}.accounts", "expected a table of tables ([clouds.<cloud>.accounts.<name>])")
    base = {k: v for k, v in raw.items() if k != "accounts"}
    if account in ("", MAIN):
        return {**base, **accounts.get(MAIN, {})}
    if account not in accounts:
        known = ", ".join([MAIN, *sorted(a for a in accounts if a != MAIN)])
        raise SpecError(f"clouds.{name}.accounts", f"unknown account {account!r} (known: {known})")
    return {**base, **accounts[account]}


def parse_settings(name: str, raw: dict[str, Any]) -> Any:
    """The cloud's settings struct from its `[clouds.<name>]` table; SpecError names a bad field."""
    if name not in _REGISTRY:
        raise SpecError(f"clouds.{name}", f"unknown cloud (known: {', '.join(sorted(_REGISTRY))})")
    module, settings, _ = _REGISTRY[name]
    cls = getattr(importlib.import_module(module), settings)
    add_secret_settings(raw)
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        raise spec_error(exc, f"clouds.{name}", root=cls) from exc


def known_gpus(cloud: Cloud) -> frozenset[str] | None:
    """The GPU names a candidate for `cloud` may say (its `gpu_names`), or None where the cloud
    does not say (not `Cataloged`: local, ssh; any name passes)."""
    return cloud.gpu_names if isinstance(cloud, Cataloged) else None


def known_regions(cloud: Cloud) -> frozenset[str] | None:
    """The region names a candidate for `cloud` may say (its `region_names`), or None."""
    return cloud.region_names if isinstance(cloud, Cataloged) else None


def make_cloud(name: str, raw: dict[str, Any], state_dir: Path) -> Cloud:
    """The cloud `name` (a cloud key: `sim`, `sim@team-b`) from the cloud's settings table `raw`."""
    cloud_name, account = split_key(name)
    module, _, cls_name = _REGISTRY[cloud_name]
    try:
        settings = parse_settings(cloud_name, account_settings(cloud_name, raw, account))
        cloud: Cloud = getattr(importlib.import_module(module), cls_name)(settings, state_dir)
    except SpecError as exc:
        if account and exc.field.startswith(f"clouds.{cloud_name}.") and not exc.field.endswith(".accounts"):
            field = exc.field.replace(f"clouds.{cloud_name}.", f"clouds.{cloud_name}.accounts.{account}.", 1)
            raise SpecError(field, exc.problem) from exc
        raise
    if account:
        cloud.account = account  # its offers and machines carry it (OfferBook, LeaseActor stamp them)
    return cloud


__all__ = [
    "MAIN", "Booting", "CacheAttaching", "Caching", "Cataloged", "Checking", "Cloud", "LaunchChecking", "MachineCheck",
    "MachineChecking", "PassingOver", "Reclaim", "Reclaiming", "SSHLogin", "SellsGpus", "account_settings",
    "accounts_of", "check_cloud_names", "cloud_key", "gpu_memory_gb",
    "known_clouds", "known_gpus", "known_regions", "make_cloud", "parse_settings", "split_key", "verify_machine",
]
