"""`actor-run run --gpu H100 [--cloud C] [--seeds 1-8] ... -- COMMAND`: a batch from flags, no file.

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

from actor_run.protocols.clouds import known_clouds
from actor_run.protocols.failures import SpecError
from actor_run.protocols.specs import MAX_USD, Batch, batch_from_table, load_batch, read_batch_table
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


def load(args: argparse.Namespace) -> Batch:
    """The batch `run` runs: the file, or the flags and the command after `--` (over the file)."""
    if args.tail is not None and not args.tail:
        raise SpecError("run", "expected a command after --")
    if not wants_table(args):
        if not args.batch:
            raise SpecError("run", "give a batch file, or a command after -- (actor-run run --gpu H100 -- CMD)")
        return load_batch(args.batch, known_clouds())
    raw, base = batch_table(args)
    return batch_from_table(raw, base, known_clouds())


def label(args: argparse.Namespace, batch: Batch) -> str:
    """What `runs` shows for the run's batch: its file, or the one-line command."""
    return str(Path(args.batch).resolve()) if args.batch else f"-- {batch.spec.job.command}"


__all__ = ["add_flags", "batch_table", "label", "load", "parse_duration", "parse_seeds", "toml_text", "wants_table"]
