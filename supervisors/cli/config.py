"""`actor-run config show [BATCH] [--json]`: the cloud settings a run would use, merged from the
user's config file and (when given) a batch file, secrets masked, each value with its source."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from actor_run.supervisors.api.config import config_path, load_config, show
from actor_run.supervisors.cli import batch_file

EPILOG = """\
examples:
  actor-run config show                      # the user config alone (~/.config/actor-run/config.toml)
  actor-run config show sweep.toml --json    # what sweep.toml's run would use, one JSON object
  actor-run --config team.toml config show sweep.toml
"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    config = sub.add_parser("config", help="the user's settings file", epilog=EPILOG,
                            description="User settings: [clouds.*] tables kept once, merged under each batch's own.")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="{show}")
    s = actions.add_parser("show", help="print the merged cloud settings, secrets masked, with their sources",
                           epilog=EPILOG)
    s.add_argument("batch", nargs="?", help="a batch file whose [clouds.*] tables override the user config")
    s.add_argument("--json", action="store_true", help="one JSON object")


def cmd_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    batch_clouds = {}
    batch_source = "batch"
    if args.batch:
        batch = batch_file.load_file(args.batch)
        batch_clouds = batch.spec.clouds
        batch_source = f"batch {args.batch}"
    rows = show(config, batch_clouds, batch_source)
    path, _ = config_path(args.config)
    if args.json:
        doc = {"config": config.path, "batch": args.batch,
               "settings": [msgspec.structs.asdict(r) for r in rows]}
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        return 0
    print(f"user config: {config.path}" if config.path else f"user config: none ({path} does not exist)")
    if args.batch:
        print(f"batch: {args.batch}")
    if not rows:
        print("no cloud settings (every cloud uses its defaults)")
        return 0
    width = max(len(f"{r.key} = {msgspec.json.encode(r.value).decode()}") for r in rows)
    for r in rows:
        line = f"{r.key} = {msgspec.json.encode(r.value).decode()}"
        print(f"{line:<{min(width, 80)}}  # {r.source}")
    return 0
