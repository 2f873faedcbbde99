"""Loading the batch a command works on: a batch file, flags over it, or flags alone. Every command
that reads a batch (`run`, `plan`, `worker`, `clouds check --batch`, `config BATCH`, `sweep --batch`)
reads it here: `load(args)` for `run`'s and `plan`'s form (file and flags), `load_file(path)` for a
batch file alone. Both check the candidates' cloud names against the clouds this install knows, and
raise `SpecError` (naming the field) on a bad batch.

`actor-run run --gpu H100 [--cloud C] [--seeds 1-8] ... -- COMMAND` is a batch from flags, no file.
The flags build the same table a batch file holds (`[job]`, `[policy]`, `[[candidates]]`); with a
batch file too, each flag given overrides the file's value (`--env` adds to the file's env,
`--gpu`/`--cloud`/`--region` set that field of every candidate). `--print-batch` prints the table
as TOML, so a line that grows can become a file. COMMAND after `--` is one shell command line when
it is one argument, else its arguments shell-quoted and joined; `{seed}` in it is the seed.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.clouds import known_clouds, parse_settings
from actor_run.protocols.clouds.gpus import GPUS, vendor_ids
from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import MAX_USD, Batch, batch_from_table, load_batch, nearest_names, read_batch_table
from actor_run.supervisors.api.config import UserConfig, config_path, load_config
from actor_run.supervisors.cli.console import number_arg

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INTERPRETERS = {"python", "python3", "sh", "bash", "uv", "torchrun", "accelerate", "deepspeed"}


def add_flags(run: argparse.ArgumentParser) -> None:
    g = run.add_argument_group("a batch from flags (with BATCH too: each flag given overrides the file's value)")
    g.add_argument("--gpu", help="the GPU class of every candidate (H100, A100-80G, ...)")
    g.add_argument("--cloud", help="the cloud of every candidate (default: the file's, else local)")
    g.add_argument("--region", action="append", metavar="R", help="a region of every candidate (repeat for more)")
    g.add_argument("--seeds", metavar="LIST", help="seeds: 1-8, 1,3,5 or 1-4,9 (default: 1)")
    g.add_argument("--env", action="append", metavar="K=V", help="an environment variable of the job (repeat)")
    g.add_argument("--code", metavar="DIR", help="the folder shipped to the machine; COMMAND runs in its copy")
    g.add_argument("--timeout", metavar="DURATION", help="each attempt's time limit: 90s, 30m, 2h, 1h30m, or seconds")
    g.add_argument("--name", help="the job's name ([a-z0-9-]; default: from COMMAND)")
    g.add_argument("--budget", type=number_arg(0, MAX_USD, strict=True), metavar="USD", help="the batch's budget_usd")
    g.add_argument("--print-batch", action="store_true",
                   help="print the batch these flags make (TOML, a file you can keep) and exit")


def wants_table(args: argparse.Namespace) -> bool:
    """Whether the flags or a COMMAND change what the batch file (if any) says."""
    flags = ("gpu", "cloud", "region", "seeds", "env", "code", "timeout", "name", "budget")
    return (bool(args.tail) or any(getattr(args, f, None) is not None for f in flags)
            or getattr(args, "print_batch", False))


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?", part)
        if not m:
            raise SpecError("--seeds", f"expected a list like 1-8 or 1,3,5, got {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi - lo > 100_000:
            raise SpecError("--seeds", f"expected a range low-high, got {part.strip()!r}")
        seeds.extend(range(lo, hi + 1))
    return seeds


def parse_duration(text: str) -> float:
    m = _DURATION.fullmatch(text.strip())
    if not text.strip() or not m or not any(m.groups()):
        raise SpecError("--timeout", f"expected a duration like 90s, 30m, 2h or 1h30m, got {text!r}")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    total = h * 3600 + mi * 60 + s
    if total <= 0:
        raise SpecError("--timeout", f"expected a duration > 0, got {text!r}")
    return total


def command_of(tail: list[str]) -> str:
    # the seed is a number: `{seed}` needs no quotes (shlex.join would write '{seed}')
    return tail[0] if len(tail) == 1 else shlex.join(tail).replace("'{seed}'", "{seed}")


def name_of(tail: list[str]) -> str:
    """A job name from the command: the script's stem (`python train.py` is train), else `job`."""
    words = shlex.split(tail[0]) if len(tail) == 1 else tail
    words = [w for w in words if not w.startswith("-")]
    while len(words) > 1 and Path(words[0]).name in _INTERPRETERS:
        words = words[1:]
    stem = re.sub(r"[^a-z0-9-]+", "-", Path(words[0]).stem.lower()).strip("-")[:40] if words else ""
    return stem or "job"


def sells(cloud: str, gpu: str, settings: dict[str, Any]) -> bool:
    """Whether `cloud`, with the user's `settings` for it, sells the GPU `gpu`: `local` only what its
    `gpus` names, the sim what its regions list, a rented cloud what the GPU table maps to its ids;
    `ssh` hosts and SkyPilot say nothing of their GPUs (name them with --cloud)."""
    folded = gpu.lower()
    try:
        parsed = parse_settings(cloud, {k: v for k, v in settings.items() if k != "accounts"})
    except SpecError:
        parsed = None
    if cloud == "local":
        return folded in {g.lower() for g in getattr(parsed, "gpus", [])}
    if cloud == "sim":
        regions = getattr(parsed, "regions", None) or []
        return any(folded == g.lower() for r in regions for g in r.gpus)
    if cloud in ("runpod", "runpod-serverless", "hyperstack", "lambda"):
        known = {g.lower() for g in GPUS}
        return folded in known and bool(vendor_ids(gpu, cloud.split("-")[0]))
    return False


def clouds_for_gpu(gpu: str, config: UserConfig) -> list[str]:
    """The clouds a one-liner with --gpu and no --cloud walks: those of the user's settings that sell
    `gpu`, in the order the settings name them. SpecError (exit 2) naming the clouds asked when none does."""
    asked = list(config.clouds)
    found = [c for c in asked if c in known_clouds() and sells(c, gpu, config.cloud_settings(c, {}))]
    if found:
        return found
    close = nearest_names(gpu, GPUS)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close and gpu not in GPUS else ""
    where = (f"asked: {', '.join(asked)}" if asked
             else f"your settings {config.path or config_path()[0]} name no [clouds.<name>]")
    raise SpecError("--gpu", f"no configured cloud sells {gpu!r} ({where}; `local` has none unless its gpus "
                    f"name it){hint}; pass --cloud to ask one")


CWD_CODE_LIMIT = 100 * 1024 * 1024  # what a one-liner sends of the current folder by itself, at most


def current_folder_as_code(cwd: Path) -> Path:
    """A one-liner without --code sends the folder it is run in (as `python3 train.py` expects),
    what `.actor-runignore` and `.gitignore` list, `.git` and `.venv` left out; SpecError (one line)
    when that is more than CWD_CODE_LIMIT."""
    from actor_run.protocols.hosts.content import code_size  # protocols.hosts loads trio: only for a run

    size = code_size(cwd, stop_at=CWD_CODE_LIMIT)
    if size > CWD_CODE_LIMIT:
        raise SpecError("--code", f"the current folder {cwd} holds more than {CWD_CODE_LIMIT // 2**20} MB to send "
                        "(a one-liner sends it as its code): list what stays here in .actor-runignore, or name "
                        "the folder to send with --code DIR")
    return cwd


def batch_table(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """The batch table (from BATCH if given, the flags over it) and the folder its paths are from."""
    if args.batch:
        raw = read_batch_table(args.batch)
        base = Path(args.batch).expanduser().resolve().parent
    else:
        if not args.tail:
            raise SpecError("run", "give a batch file, or a command after -- (actor-run run --gpu H100 -- CMD)")
        raw, base = {}, Path.cwd()
    job: dict[str, Any] = dict(raw.get("job") or {})
    if args.tail:
        job["command"] = command_of(args.tail)
        job.setdefault("name", name_of(args.tail))
    if args.name is not None:
        job["name"] = args.name
    if args.seeds is not None:
        job["seeds"] = parse_seeds(args.seeds)
    job.setdefault("seeds", [1])
    if args.code is not None:
        job["code"] = str(Path(args.code).expanduser().resolve())
    elif not args.batch and args.tail:
        job["code"] = str(current_folder_as_code(Path.cwd()))
    if args.timeout is not None:
        job["timeout_s"] = parse_duration(args.timeout)
    if args.env:
        env = dict(job.get("env") or {})
        for item in args.env:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise SpecError("--env", f"expected K=V, got {item!r}")
            env[key] = value
        job["env"] = env
    raw["job"] = job
    if args.budget is not None:
        raw["policy"] = {**(raw.get("policy") or {}), "budget_usd": args.budget}
    if args.gpu and args.cloud is None and not raw.get("candidates"):  # a one-liner: the clouds that sell it
        raw["candidates"] = [{"cloud": c} for c in clouds_for_gpu(args.gpu, load_config(getattr(args, "config", None)))]
    if args.gpu is not None or args.cloud is not None or args.region:
        candidates = [dict(c) for c in raw.get("candidates") or [{}]]
        for c in candidates:
            if args.cloud is not None:
                c["cloud"] = args.cloud
            if args.gpu is not None:
                c["gpu"] = args.gpu
            if args.region:
                c["regions"] = list(args.region)
        unique: list[dict[str, Any]] = []
        for c in candidates:  # two candidates the flags made the same are one
            if c not in unique:
                unique.append(c)
        raw["candidates"] = unique
    if args.batch and job.get("code") is not None:
        job["code"] = str((base / job["code"]).resolve())  # the printed batch works from any folder
    if args.batch and job.get("inputs"):
        job["inputs"] = {k: str((base / v).resolve()) for k, v in job["inputs"].items()}
    return raw, base


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else msgspec.json.encode(k).decode()


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return msgspec.json.encode(v).decode()  # a JSON string or number is a TOML one
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise SpecError("batch", f"cannot write {type(v).__name__} as TOML")


def _table(lines: list[str], header: str, table: dict[str, Any]) -> None:
    lines.append(header)
    lines.extend(f"{_key(k)} = {_value(v)}" for k, v in table.items())
    lines.append("")


def toml_text(raw: dict[str, Any]) -> str:
    """A batch table as a TOML batch file (`load_batch` reads it back to the same batch)."""
    lines: list[str] = []
    _table(lines, "[job]", raw["job"])
    if raw.get("policy"):
        _table(lines, "[policy]", raw["policy"])
    for c in raw.get("candidates") or []:
        _table(lines, "[[candidates]]", c)
    for name, settings in (raw.get("clouds") or {}).items():
        _table(lines, f"[clouds.{_key(name)}]", settings)
    return "\n".join(lines)


def load_file(path: str | Path) -> Batch:
    """A batch file, checked (its clouds among the known ones). Raises SpecError, OSError."""
    return load_batch(path, known_clouds())


def load(args: argparse.Namespace) -> Batch:
    """The batch `run` (and `plan`, `worker`) runs: the file, or the flags and the command after `--`
    (over the file). Raises SpecError."""
    if args.tail is not None and not args.tail:
        raise SpecError("run", "expected a command after --")
    if not wants_table(args):
        if not args.batch:
            raise SpecError("run", "give a batch file, or a command after -- (actor-run run --gpu H100 -- CMD)")
        return load_file(args.batch)
    raw, base = batch_table(args)
    return batch_from_table(raw, base, known_clouds())


def label(args: argparse.Namespace, batch: Batch) -> str:
    """What `runs` shows for the run's batch: its file, or the one-line command."""
    return str(Path(args.batch).resolve()) if args.batch else f"-- {batch.spec.job.command}"


__all__ = [
    "add_flags", "batch_table", "label", "load", "load_file", "parse_duration", "parse_seeds", "toml_text",
    "wants_table",
]
