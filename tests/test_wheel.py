"""The package as a user gets it: the wheel, installed into a fresh venv, adds only `actor_run` (and
its dist-info) to site-packages, and runs a one-job batch through the public API from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN_ONE = textwrap.dedent("""
    import json, sys
    import actor_run
    from actor_run import Batch, Candidate, Policy, Runner

    out, state = sys.argv[1], sys.argv[2]
    batch = Batch.build(name="wheel", command="echo seed-{seed} > $ACTOR_RUN_OUT/hello.txt", seeds=[5],
                        timeout_s=60, policy=Policy(max_attempts=1, poll_s=0.2), candidates=[Candidate(cloud="local")])
    with Runner(out_dir=out, state_dir=state) as runner:
        ended = runner.submit(batch.jobs()[0]).result(timeout=120)
    print(json.dumps({"file": actor_run.__file__, "version": actor_run.__version__, "outcome": ended.outcome,
                      "out_dir": ended.out_dir}))
""")


def test_the_wheel_installs_one_namespace_and_runs_a_batch(tmp_path: Path) -> None:
    # built from a copy of what the wheel is made of: setuptools' build/ and egg-info stay out of the tree
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("actor_run", "actors", "protocols", "supervisors"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(dist), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("actor_run-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    before = set(os.listdir(site))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    added = set(os.listdir(site)) - before
    assert added == {"actor_run", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    package = site / "actor_run"
    assert {p.name for p in package.iterdir()} >= {"__init__.py", "__main__.py", "py.typed", "actors", "protocols",
                                                   "supervisors"}
    assert not any(p.is_symlink() for p in package.rglob("*"))  # the source tree's links became real folders

    # the dependencies come from this test's venv (offline): a path after the fresh venv's own
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([python, "-c", RUN_ONE, str(tmp_path / "out"), str(tmp_path / "state")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert Path(result["file"]) == package / "__init__.py"  # imported from the wheel, not the source tree
    assert result["outcome"] == "succeeded"
    assert (Path(result["out_dir"]) / "out" / "hello.txt").read_text() == "seed-5\n"

    version = subprocess.run([venv / "bin" / "actor-run", "--version"], capture_output=True, text=True, timeout=60,
                             env=env, cwd=tmp_path)
    assert version.stdout.strip() == f"actor-run {result['version']}"
    assert result["version"] == wheel.name.split("-")[1]
