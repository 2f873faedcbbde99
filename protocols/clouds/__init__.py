"""Clouds: the Cloud protocol and one module per provider; `make_cloud` builds one from settings."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.clouds.base import Cloud, Reclaim, Reclaiming
from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import spec_error

# name -> (module, settings struct, cloud class)
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "local": ("actor_run.protocols.clouds.local", "LocalSettings", "LocalCloud"),
    "runpod-serverless": ("actor_run.protocols.clouds.runpod_serverless", "ServerlessSettings", "ServerlessCloud"),
    "sim": ("actor_run.protocols.clouds.sim", "SimSettings", "SimCloud"),
    "ssh": ("actor_run.protocols.clouds.ssh", "SSHSettings", "SSHCloud"),
    "runpod": ("actor_run.protocols.clouds.runpod", "RunPodSettings", "RunPodCloud"),
}


def known_clouds() -> set[str]:
    return set(_REGISTRY)


def parse_settings(name: str, raw: dict[str, Any]) -> Any:
    """The cloud's settings struct from its `[clouds.<name>]` table; SpecError names a bad field."""
    if name not in _REGISTRY:
        raise SpecError(f"clouds.{name}", f"unknown cloud (known: {', '.join(sorted(_REGISTRY))})")
    module, settings, _ = _REGISTRY[name]
    cls = getattr(importlib.import_module(module), settings)
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        raise spec_error(exc, f"clouds.{name}") from exc


def make_cloud(name: str, raw: dict[str, Any], state_dir: Path) -> Cloud:
    module, _, cls_name = _REGISTRY[name]
    settings = parse_settings(name, raw)
    cloud: Cloud = getattr(importlib.import_module(module), cls_name)(settings, state_dir)
    return cloud


__all__ = ["Cloud", "Reclaim", "Reclaiming", "known_clouds", "make_cloud", "parse_settings"]
