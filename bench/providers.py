"""Rented clouds at scale: a batch of attempts against each vendor's fake on loopback.

Each attempt is what a lease does on the happy path: launch (create, then readiness reads) and
delete (delete, then the read that proves it gone), through the real adapter and its pooled HTTP
client, against the fake provider held to the vendor's OpenAPI document (every request and
response checked). The fake's machines are virtual (no sshd): this measures the API side.

Printed per provider:
- HTTP calls per attempt on the happy path (goal: at most 6), and the calls made once per process
  (offers, Hyperstack's environment and keypair);
- a second batch with 429s injected: how many were sent, honoured (waited out and repeated) and
  whether every attempt still ended deleted;
- wall over ideal: the batch's wall time over the time the same number of plain reads takes on
  the same fake at the same concurrency, measured in the same run (the HTTP floor), plus the
  Retry-After seconds the 429s imposed on one chain of calls.

    .venv/bin/python bench/providers.py [--attempts 200] [--concurrency 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import trio  # noqa: E402
from fakes.keys import client_key  # noqa: E402
from fakes.providers import FAKES  # noqa: E402
from loguru import logger  # noqa: E402

from actor_run.protocols.clouds import make_cloud  # noqa: E402
from actor_run.protocols.specs import CandidateSpec  # noqa: E402

ONCE = {"GET /core/environments", "POST /core/environments", "GET /core/keypairs", "POST /core/keypairs",
        "GET /api/v1/ssh-keys", "POST /api/v1/ssh-keys"}
OFFERS = {"GET /v2/catalog/gpus", "GET /api/v1/instance-types", "GET /core/flavors", "GET /core/stocks",
          "GET /pricebook"}


def _cloud(name: str, fake: Any, tmp: Path) -> Any:
    os.environ[fake.KEY_VAR] = fake.token
    raw = {"api_url": fake.url, "ssh_key": str(client_key(tmp / "keys")), "poll_s": 0.05, "listing_lag_s": 1.0,
           "delete_wait_s": 30.0, "launch_timeout_s": 60.0, **fake.settings()}
    return make_cloud(name, raw, tmp / "state")


async def _batch(cloud: Any, fake: Any, attempts: int, concurrency: int, tag: str) -> tuple[float, int]:
    offer = fake.sample_offer()
    limit = trio.Semaphore(concurrency)
    ok = 0

    async def one(i: int) -> None:
        nonlocal ok
        async with limit:
            name = f"ar-bench-{i}-a0-{tag}-d{int(time.time()) + 3600}"
            machine = await cloud.launch(offer, name, time.time() + 3600)
            await cloud.delete(name, machine.id)
            ok += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(attempts):
            nursery.start_soon(one, i)
    return time.perf_counter() - t0, ok


async def _floor(cloud: Any, calls: int, concurrency: int, path: str) -> float:
    """The same number of plain reads at the same concurrency: what the HTTP round trips cost here."""
    limit = trio.Semaphore(concurrency)

    async def one() -> None:
        async with limit:
            await cloud.api.call("GET", path)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(calls):
            nursery.start_soon(one)
    return time.perf_counter() - t0


FLOOR_PATH = {"runpod": "/v2/pods/none", "lambda": "/api/v1/instances/none", "hyperstack": "/core/virtual-machines/1"}


def run_provider(name: str, attempts: int, concurrency: int, rate_limited: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as d:
        tmp = Path(d)
        fake = FAKES[name](tmp / "fake", virtual=True).start()
        try:
            with fake.lock:
                for key in fake.stock:
                    fake.stock[key] = attempts * 2
            cloud = _cloud(name, fake, tmp)

            async def main() -> dict[str, Any]:
                await cloud.offers(CandidateSpec(cloud=name, gpu=fake.sample_offer().gpu), 0)
                wall, ok = await _batch(cloud, fake, attempts, concurrency, "0badc0de")
                with fake.lock:
                    calls = [f"{m} {t}" for m, t, _ in fake.calls]
                per_attempt = [c for c in calls if c not in ONCE and c not in OFFERS]
                floor = await _floor(cloud, len(per_attempt), concurrency, FLOOR_PATH[name])
                # the same batch again with 429s: each must be waited out and the call repeated
                before = cloud.api.statistics()
                fake.rate_limit(rate_limited, retry_after=1)
                wall429, ok429 = await _batch(cloud, fake, attempts, concurrency, "0badc0df")
                after = cloud.api.statistics()
                await cloud.aclose()
                return {
                    "provider": name, "attempts": attempts, "concurrency": concurrency, "deleted": ok,
                    "calls_per_attempt": round(len(per_attempt) / attempts, 2),
                    "calls_once": len([c for c in calls if c in ONCE]),
                    "offer_calls": len([c for c in calls if c in OFFERS]),
                    "wall_s": round(wall, 2), "floor_s": round(floor, 2), "wall_over_ideal": round(wall / floor, 2),
                    "rate_limited_sent": fake.rate_limited_sent,
                    "rate_limited_honoured": after.rate_limited - before.rate_limited,
                    "deleted_with_429s": ok429, "wall_429_s": round(wall429, 2),
                    "wall_429_over_ideal": round(wall429 / (floor + 1.0), 2),
                    "machines_left": len(fake.alive()), "violations": len(fake.violations),
                }

            return trio.run(main)
        finally:
            fake.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attempts", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--rate-limited", type=int, default=20, help="429s injected in the second batch")
    p.add_argument("--providers", default=",".join(sorted(FAKES)))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    logger.remove()
    rows = [run_provider(n, args.attempts, args.concurrency, args.rate_limited) for n in args.providers.split(",")]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"{'provider':<11} {'attempts':>8} {'calls/att':>9} {'once':>4} {'offers':>6} {'wall s':>7} "
          f"{'floor s':>7} {'wall/ideal':>10} {'429 sent':>8} {'honoured':>8} {'wall429/ideal':>13} {'left':>4} "
          f"{'viol':>4}")
    for r in rows:
        print(f"{r['provider']:<11} {r['deleted']:>8} {r['calls_per_attempt']:>9} {r['calls_once']:>4} "
              f"{r['offer_calls']:>6} {r['wall_s']:>7} {r['floor_s']:>7} {r['wall_over_ideal']:>10} "
              f"{r['rate_limited_sent']:>8} {r['rate_limited_honoured']:>8} {r['wall_429_over_ideal']:>13} "
              f"{r['machines_left']:>4} {r['violations']:>4}")


if __name__ == "__main__":
    main()
