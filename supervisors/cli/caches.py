"""The cache volumes part of `actor-run sweep`: every cache volume of ours each cloud holds (named
`ar-cache-*`), listed with what the ledger knows of it; `--caches` deletes them (a run never does).
Runs on the caller's thread; each provider call goes through the Runner's reactor."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

import msgspec

from actor_run.protocols.clouds import Caching, accounts_of, cloud_key
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import CacheVolume
from actor_run.supervisors.api.config import build_cloud
from actor_run.supervisors.ledger.reader import LedgerReader

if TYPE_CHECKING:
    from actor_run.supervisors.api.runner import Runner

CALL_TIMEOUT_S = 120.0


class CacheAction(msgspec.Struct, frozen=True, kw_only=True, tag="cache"):
    """What the sweep did with one cache volume: `kept`, `deleted`, `would delete` or `failed`."""

    cache: str
    cloud: str
    region: str
    volume: str
    size_gb: int
    action: str
    detail: str = ""


def _clouds(runner: Runner) -> tuple[dict[str, Any], set[str]]:
    """Every cloud the sweep can ask (those that keep caches have `list_caches`): the Runner's, each
    in the user's config, each the ledger has seen (built from its stored settings, only to list and
    delete); and which were built here (to be closed)."""
    clouds: dict[str, Any] = dict(runner.clouds)
    wanted: list[tuple[str, dict[str, Any]]] = [(cloud_key(name, account), {})
                                                for name, table in runner.config.clouds.items()
                                                for account in accounts_of(table)]
    reader = LedgerReader(runner.ledger_path)
    try:
        wanted += list(reader.clouds())
        wanted += [(c.cloud, {}) for c in reader.caches()]
    finally:
        reader.close()
    built: set[str] = set()
    for key, table in wanted:
        if key in clouds:
            continue
        try:
            clouds[key], _ = build_cloud(key, table, runner.config, runner.state_dir)
            built.add(key)
        except SpecError:  # its settings are not here now (the machines' sweep said so already)
            continue
    return clouds, built


def sweep_caches(runner: Runner, *, delete: bool, dry_run: bool) -> list[CacheAction]:
    """List (and with `delete`, delete) the cache volumes of every cloud that keeps them."""
    out: list[CacheAction] = []
    clouds, built = _clouds(runner)
    try:
        for key, cloud in sorted(clouds.items()):
            if isinstance(cloud, Caching):
                out += _sweep_one(runner, key, cloud, delete=delete, dry_run=dry_run)
    finally:
        for key in built:
            with contextlib.suppress(Exception):  # closing a client must not stop the sweep's answer
                runner.reactor.call(clouds[key].aclose, timeout=30)
    return out


def _sweep_one(runner: Runner, key: str, cloud: Any, *, delete: bool, dry_run: bool) -> list[CacheAction]:
    out: list[CacheAction] = []
    try:
        volumes: list[CacheVolume] = runner.reactor.call(cloud.list_caches, timeout=CALL_TIMEOUT_S)
    except Exception as exc:  # one cloud that does not answer: said, the others still listed
        return [CacheAction(cache="*", cloud=key, region="", volume="", size_gb=0, action="failed", detail=str(exc))]
    for v in volumes:
        action, detail = "kept", "`actor-run sweep --caches` deletes it"
        if delete and dry_run:
            action, detail = "would delete", ""
        elif delete:
            try:
                runner.reactor.call(cloud.delete_cache, v.id, timeout=CALL_TIMEOUT_S)
                runner.ledger.record_cache_deleted(cloud=key, region=v.region, name=v.name, at=time.time())
                action, detail = "deleted", ""
            except Exception as exc:  # said per volume; the sweep goes on with the others
                action, detail = "failed", str(exc)
        out.append(CacheAction(cache=v.name, cloud=key, region=v.region, volume=v.id, size_gb=v.size_gb,
                               action=action, detail=detail))
    return out


def print_caches(actions: list[CacheAction], ledger_path: Any, *, json_mode: bool) -> bool:
    """Print them; True when one failed."""
    known = {(c.cloud, c.region, c.name): c for c in _rows(ledger_path)}
    failed = False
    for a in actions:
        if json_mode:
            sys.stdout.write(msgspec.json.encode(a).decode() + "\n")
        else:
            row = known.get((a.cloud, a.region, a.cache))
            spent = f", ${row.usd():.4f} of storage so far" if row is not None else ""
            tail = f": {a.detail}" if a.detail else ""
            print(f"cache {a.cache:<40} {a.cloud:<6} {a.region:<10} {a.volume} {a.size_gb} GB{spent}  {a.action}{tail}")
        if a.action == "failed":
            failed = True
            sys.stderr.write(f"actor-run: cache {a.cache} on {a.cloud}: {a.detail}\n")
    return failed


def _rows(ledger_path: Any) -> list[Any]:
    reader = LedgerReader(ledger_path)
    try:
        return reader.caches()
    finally:
        reader.close()


__all__ = ["CacheAction", "print_caches", "sweep_caches"]
