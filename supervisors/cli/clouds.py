"""`actor-run clouds check [NAME] [--batch FILE]`: does my key work, and what could I rent now?

For each cloud (NAME, or the ones a batch's candidates name, or every one: local, sim, the rented
ones, runpod-serverless; ssh and skypilot when configured) it makes only read-only calls: the list
of machines (the key works; our machines alive) and the catalog (which of the candidates' GPUs are
in stock where, at what price). No local SSH key is read. Settings come from the user config with
the batch's `[clouds.<name>]` table over it. A cloud without its key is named with the variable to
set (exit 2); a key refused or an API that does not answer is exit 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from actor_run.protocols.clouds import Cloud, SellsGpus, known_clouds, make_cloud
from actor_run.protocols.clouds.gpus import GPUS as TABLE
from actor_run.protocols.failures import ActorRunError, LaunchError, SpecError
from actor_run.protocols.messages import Offer
from actor_run.protocols.names import PREFIX
from actor_run.protocols.specs import CandidateSpec
from actor_run.supervisors.api.config import load_config
from actor_run.supervisors.cli import batch_file

# asked about GPU classes
RENTED = ("hyperstack", "lambda", "runpod", "runpod-serverless", "shadeform", "skypilot", "vastai")
WHEN_CONFIGURED = ("ssh", "skypilot")  # checked without a NAME only when the user config or batch has their table
GPUS = tuple(TABLE)  # what a rented cloud is asked for without a batch: the GPU table, every name
CALL_TIMEOUT_S = 60.0

EXAMPLE = """examples:
  actor-run clouds check                         # every rented cloud (one without its key names the variable)
  actor-run clouds check runpod                  # RunPod only (RUNPOD_API_KEY)
  actor-run clouds check --batch examples/runpod.toml   # the batch's settings and candidates
"""


def add_parser(sub: Any) -> None:
    clouds = sub.add_parser("clouds", help="check a cloud's key, stock and our machines there",
                            epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = clouds.add_subparsers(dest="clouds_command", required=True)  # the parent's class: one-line errors
    check = what.add_parser("check", help="read-only calls: the key, the stock, our machines alive", epilog=EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("name", nargs="?", choices=sorted(known_clouds()),
                       help="one cloud (default: each one the batch names, or every configured one)")
    check.add_argument("--batch", help="a batch file: its [clouds.<name>] settings and its candidates' GPUs")
    check.add_argument("--state-dir", help=argparse.SUPPRESS)


def _plan(args: argparse.Namespace, configured: set[str]
          ) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, list[CandidateSpec]], list[str]]:
    """The clouds to check, their settings and the candidates to ask each about."""
    settings: dict[str, dict[str, Any]] = {}
    candidates: dict[str, list[CandidateSpec]] = {}
    if args.batch:
        batch = batch_file.load_file(args.batch)
        settings = dict(batch.spec.clouds)
        for c in batch.spec.candidates:
            candidates.setdefault(c.cloud, []).append(c)
    names = [args.name] if args.name else (sorted(candidates) or sorted(known_clouds()))
    unconfigured = [] if args.name else [n for n in WHEN_CONFIGURED if n not in configured | set(settings)]
    for name in names:
        gpus = GPUS if name in RENTED else ("",)  # the sim: what its regions sell (cmd_clouds)
        candidates.setdefault(name, [CandidateSpec(cloud=name, gpu=g) for g in gpus])
    return names, settings, candidates, unconfigured


async def _check(cloud: Cloud, candidates: list[CandidateSpec], *, keyed: bool) -> tuple[list[str], bool]:
    import trio

    lines: list[str] = []
    try:
        with trio.fail_after(CALL_TIMEOUT_S):
            ours = await cloud.list_ours(PREFIX)
    except (ActorRunError, trio.TooSlowError) as exc:
        refused = isinstance(exc, LaunchError) or "refused" in str(exc)
        return [f"  the key was refused: {exc}" if refused else f"  no answer: {exc}"], False
    lines.append(f"  {'the key works' if keyed else 'it answers'}; {len(ours)} machine(s) of ours alive")
    for m in ours:
        left = m.deadline - time.time()
        lines.append(f"    {m.name}  {m.region}  ${m.hourly_usd:.2f}/h  deadline in {left / 60:.0f} min")
    ok = True
    for i, c in enumerate(candidates):
        try:
            with trio.fail_after(CALL_TIMEOUT_S):
                offers: list[Offer] = await cloud.offers(c, i)
        except (ActorRunError, trio.TooSlowError) as exc:
            lines.append(f"  {c.gpu or 'any GPU'}: the catalog did not answer: {exc}")
            ok = False
            continue
        if not offers:
            lines.append(f"  {c.gpu or 'any GPU'}: out of stock" + (f" in {', '.join(c.regions)}" if c.regions else ""))
        for o in offers:
            lines.append(f"  {o.gpu or 'any GPU'}: in stock in {o.region} at ${o.hourly_usd:.2f}/h"
                         + (f" ({o.kind})" if o.kind else "") + (f", stock {o.stock}" if o.stock else ""))
    return lines, ok


def cmd_clouds(args: argparse.Namespace) -> int:
    import trio  # the reactor's library: only when a cloud is asked (`actor-run --help` needs none of it)

    try:
        config = load_config(args.config)  # the user's [clouds.*] tables, the batch's over them
        names, settings, candidates, unconfigured = _plan(args, set(config.clouds))
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return 2
    state = Path(args.state_dir)
    missing, failed = False, False
    for name in names:
        print(f"{name}:")
        if name in unconfigured:
            print(f"  not configured (no [clouds.{name}] table in your config): `actor-run clouds check {name}`"
                  " checks it with the defaults")
            continue
        try:
            cloud = make_cloud(name, config.cloud_settings(name, settings.get(name, {})), state)
        except SpecError as exc:
            print(f"  cannot check: {exc.problem}")
            missing = True
            continue
        sold = cloud.sold_gpus if isinstance(cloud, SellsGpus) else None  # the sim's regions say what it sells
        if sold is not None and candidates[name] == [CandidateSpec(cloud=name)]:
            candidates[name] = [CandidateSpec(cloud=name, gpu=g) for g in sold]

        async def run(cloud: Cloud = cloud, name: str = name) -> tuple[list[str], bool]:
            try:
                return await _check(cloud, candidates[name], keyed=name in RENTED)
            finally:
                await cloud.aclose()

        lines, ok = trio.run(run)
        print("\n".join(lines))
        failed = failed or not ok
    if missing:
        return 2
    return 1 if failed else 0


__all__ = ["add_parser", "cmd_clouds"]
