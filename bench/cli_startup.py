"""What one `actor-run` process costs in CPU (user + sys, its children included), per command:
`--version`, `status` and `runs` on a small ledger, the README's first run (`run examples/seeds.toml`,
three seeds on the local cloud, which makes that ledger; its output to a pipe, as in scripts and
tests), the same with `--json`, and a `sweep` of that ledger (the reactor and the clouds, nothing
to delete).

Each command runs `--samples` times in a fresh state folder; the figure is the median. Prints a
table, then as its last line one JSON object: {"<command>": median CPU seconds, ...}.

    python bench/cli_startup.py [--samples 5] [--exe .venv/bin/actor-run]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_s(cmd: list[str], env: dict[str, str]) -> float:
    """The CPU seconds (user + sys) of one command and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--exe", default=shutil.which("actor-run") or str(ROOT / ".venv" / "bin" / "actor-run"))
    a = p.parse_args()
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp:
        env = {**os.environ, "XDG_STATE_HOME": str(Path(tmp) / "state"), "XDG_CONFIG_HOME": str(Path(tmp) / "config")}
        for name in ("ACTOR_RUN_LEDGER", "ACTOR_RUN_CONFIG"):  # the defaults: a fresh state folder, no settings
            env.pop(name, None)
        # compiled bytecode written once and read after (as scripts/test.sh does): the figure is the
        # import, not the compiling a PYTHONDONTWRITEBYTECODE environment would add to every process
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        commands = {
            "run examples/seeds.toml": [a.exe, "run", "examples/seeds.toml", "--out", str(Path(tmp) / "out")],
            "run examples/seeds.toml --json": [a.exe, "run", "examples/seeds.toml", "--json", "--out",
                                               str(Path(tmp) / "out")],
            "--version": [a.exe, "--version"],
            "status": [a.exe, "status"],
            "runs": [a.exe, "runs"],
            "sweep": [a.exe, "sweep"],
        }
        for name, cmd in commands.items():  # the run first: it makes the ledger the others read
            figures[name] = [cpu_s(cmd, env) for _ in range(a.samples)]
    medians = {name: round(statistics.median(v), 3) for name, v in figures.items()}
    print(f"{'command':<34}{'median CPU s':>14}{'min':>8}{'max':>8}   ({a.samples} runs each)", file=sys.stderr)
    for name, v in figures.items():
        print(f"{name:<34}{medians[name]:>14.3f}{min(v):>8.3f}{max(v):>8.3f}", file=sys.stderr)
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
