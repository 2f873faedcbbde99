"""`actor-run offers [--gpu G] [--cloud NAME] [--region R] [--max-price USD] [--json]`: what every
configured cloud would rent now, cheapest first, with what it says of its stock, the machine's price
per hour (an `H100:8` shape's is the whole machine's) and the image it would boot. No batch needed.

Configured: `local` (unless a GPU class is asked for) and `sim` always; `ssh` and `skypilot` when
the user config has their table; a rented cloud (runpod, lambda, hyperstack, runpod-serverless)
when its key is set (each account of it too). Only read-only calls are made (the catalog); no local
SSH key is needed. A cloud left out is named on stderr with why; one that does not answer is exit 1.

Two clouds answer only some questions. The `ssh` cloud's hosts are the user's, at $0, one offer each
(its region is the host's name); under `--gpu` only hosts that declare such GPUs (`gpus = "A100:4"`)
are listed; with none that declare any, the cloud is left out (as `local` is), with a note.
SkyPilot's catalog is asked for one GPU class in one region at a time (each a `sky gpus list`):
without `--gpu`, or without a region (`--region`, or the region of `clouds.skypilot.infra`), it is
not asked, and the note says what to add.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.clouds import Cloud, accounts_of, cloud_key, known_clouds
from actor_run.protocols.failures import ActorRunError, SpecError
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import MAX_USD, CandidateSpec
from actor_run.supervisors.api.config import UserConfig, build_cloud, load_config
from actor_run.supervisors.cli.console import Exit, number_arg

CALL_TIMEOUT_S = 60.0
ALWAYS = ("local", "sim")  # nothing to configure
WHEN_CONFIGURED = ("ssh", "skypilot")  # asked when the user config has their table

EXAMPLE = """examples:
  actor-run offers                       # every configured cloud, cheapest first
  actor-run offers --gpu H100 --max-price 3
  actor-run offers --gpu H100:8          # 8-GPU machines, at the machine's price
  actor-run offers --cloud runpod --region EU-RO-1 --json
"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("offers", help="what every configured cloud would rent now, cheapest first, with stock",
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", default="", help="one GPU class, or a machine's shape (H100, A100-80G, H100:8: eight "
                   "on one machine; default: every one-GPU machine)")
    p.add_argument("--cloud", action="append", choices=sorted(known_clouds()), metavar="NAME",
                   help="only this cloud (repeat for more; default: every configured one)")
    p.add_argument("--region", action="append", metavar="R", help="only this region (repeat for more)")
    p.add_argument("--max-price", type=number_arg(0, MAX_USD), metavar="USD", help="only offers at most this many $/h")
    p.add_argument("--interruptible", action="store_true",
                   help="interruptible capacity (Vast bids, Shadeform spot) at its own price")
    p.add_argument("--json", action="store_true", help="one offer per line (JSON)")
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def open_clouds(names: list[str], config: UserConfig, state: Path, tables: dict[str, dict[str, Any]] | None = None,
                *, explicit: bool) -> tuple[dict[str, Cloud], dict[str, str]]:
    """Each account of each cloud in `names` that can be built ({key: cloud}) and why the others
    cannot ({name: reason}). `tables` are a batch's `[clouds.*]`, over the user's. When not
    `explicit`, ssh and skypilot without a table of theirs are not configured (left out quietly)."""
    clouds: dict[str, Cloud] = {}
    skipped: dict[str, str] = {}
    tables = tables or {}
    for name in names:
        if not explicit and name in WHEN_CONFIGURED and name not in config.clouds and name not in tables:
            continue
        table = tables.get(name, {})
        try:
            for account in accounts_of(config.cloud_settings(name, table)):
                key = cloud_key(name, account)
                clouds[key], _ = build_cloud(key, table, config, state)
        except SpecError as exc:
            skipped[name] = exc.problem
    return clouds, skipped


async def ask(cloud: Cloud, candidate: CandidateSpec, index: int) -> list[Offer] | str:
    """The cloud's offers for `candidate` now, or what went wrong (one line)."""
    import trio

    try:
        with trio.fail_after(CALL_TIMEOUT_S):
            found = await cloud.offers(candidate, index)
    except trio.TooSlowError:
        return f"no answer in {CALL_TIMEOUT_S:.0f} s"
    except (ActorRunError, SpecError) as exc:
        return str(exc)
    account = cloud.account
    return [o if o.account or not account else msgspec.structs.replace(o, account=account) for o in found]


async def aclose_all(clouds: dict[str, Cloud]) -> None:
    for cloud in clouds.values():
        await cloud.aclose()


def cmd_offers(args: argparse.Namespace) -> int:
    import trio  # the reactor's library: only when a cloud is asked (`actor-run --help` needs none of it)

    try:
        config = load_config(args.config)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    if args.max_price is not None and args.max_price < 0:
        sys.stderr.write(f"actor-run: --max-price: expected a number >= 0, got {args.max_price}\n")
        return Exit.USAGE
    explicit = bool(args.cloud)
    names = list(dict.fromkeys(args.cloud)) if explicit else sorted(known_clouds())
    clouds, skipped = open_clouds(names, config, Path(args.state_dir), explicit=explicit)
    if explicit and skipped:
        for name, why in skipped.items():
            sys.stderr.write(f"actor-run: {name}: {why}\n")
        return Exit.USAGE

    left_out: dict[str, Cloud] = {}
    for key in list(clouds):
        reason = not_asked(key, clouds[key], args)
        if reason is not None:
            left_out[key] = clouds.pop(key)
            if reason:
                skipped[key] = reason
    trio.run(aclose_all, left_out)
    if not clouds:  # nothing to ask: what the question lacks, as a usage error
        for key, why in sorted(skipped.items()):
            sys.stderr.write(f"actor-run: {key}: {why}\n")
        return Exit.USAGE

    async def gather() -> dict[str, list[Offer] | str]:
        answers: dict[str, list[Offer] | str] = {}

        async def one(key: str, cloud: Cloud) -> None:
            candidate = CandidateSpec(cloud=key.partition("@")[0], gpu=args.gpu, regions=list(args.region or []),
                                      max_hourly_usd=args.max_price,
                                      interruptible=bool(getattr(args, "interruptible", False)))
            answers[key] = await ask(cloud, candidate, 0)

        try:
            async with trio.open_nursery() as nursery:
                for key, cloud in clouds.items():
                    nursery.start_soon(one, key, cloud)
        finally:
            await aclose_all(clouds)
        return answers

    answers = trio.run(gather)
    offers = [o for found in answers.values() if isinstance(found, list) for o in found
              if args.max_price is None or o.hourly_usd <= args.max_price]
    offers.sort(key=lambda o: (o.hourly_usd, o.cloud, o.account, o.region, o.gpu))
    if args.json:
        for o in offers:
            sys.stdout.write(msgspec.json.encode(o).decode() + "\n")
    else:
        print_table(offers)
    failed = {k: v for k, v in answers.items() if isinstance(v, str)}
    for key, why in sorted(failed.items()):
        sys.stderr.write(f"actor-run: {key}: {why}\n")
    for key, why in sorted(skipped.items()):
        sys.stderr.write(f"not asked: {key}: {why}\n")
    return Exit.FAILED if failed else Exit.OK


def not_asked(key: str, cloud: Cloud, args: argparse.Namespace) -> str | None:
    """Why the cloud `key` is not asked this question (\"\": left out quietly), or None: ask it."""
    name = key.partition("@")[0]
    if name == "local" and args.gpu:
        return ""  # this computer: whatever GPU it has, not one of a class
    if name == "ssh" and args.gpu:
        from actor_run.protocols.clouds.ssh import SSHCloud  # here: asyncssh only where an ssh cloud is asked

        hosts = cloud.settings.hosts if isinstance(cloud, SSHCloud) else {}
        if any(h.gpus for h in hosts.values()):
            return None
        return (f"its hosts declare no GPU class, so none is offered as {args.gpu} (a host declares its GPUs "
                "with clouds.ssh.hosts.<name>.gpus; without --gpu each host is listed)")
    if name == "skypilot":
        if not args.gpu:
            return ("SkyPilot's catalog is asked for one GPU class at a time: name one with --gpu "
                    "(for example --gpu A10G)")
        from actor_run.protocols.clouds.skypilot import SkyPilotCloud  # made already: the key says skypilot

        infra = cloud.settings.infra if isinstance(cloud, SkyPilotCloud) else ""
        if not args.region and len(infra.split("/")) < 2:
            return (f"SkyPilot's catalog is asked for one region at a time: name one with --region (or set "
                    f"clouds.skypilot.infra = 'aws/<region>'; it is {infra!r})")
    return None


def print_table(offers: list[Offer]) -> None:
    if not offers:
        print("no offers (nothing in stock that fits)")
        return
    rows = [("CLOUD", "REGION", "GPU", "$/H", "STOCK", "KIND", "INTERRUPTIBLE", "IMAGE")]
    rows += [(cloud_key(o.cloud, o.account), o.region.replace(" ", ""), o.gpu or "-", f"{o.hourly_usd:.4f}",
              o.stock or "-", o.kind or "-", interruptible(o), o.image or "-") for o in offers]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.rjust(w) if i in (3, 6) else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths,
                                                                                                         strict=True)))
              .rstrip())


def interruptible(o: Offer) -> str:
    """The place's interruptible $/h beside its on-demand one (issue 45): `-` where none is sold;
    an offer that is itself interruptible (a bid, spot) says `=` (its $/H is that price)."""
    if o.interruptible:
        return "="
    return f"{o.interruptible_usd:.4f}" if o.interruptible_usd else "-"


__all__ = ["add_parser", "ask", "cmd_offers", "interruptible", "not_asked", "open_clouds"]
