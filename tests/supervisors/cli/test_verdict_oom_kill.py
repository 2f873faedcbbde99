"""A real OOM kill (issue 43): a job that joins a memory cgroup of its own with a small limit and
allocates past it is killed by the kernel's OOM killer (SIGKILL, exit 137); the job's wrapper finds
the machine's own evidence (the kernel log's OOM killer lines, the cgroup's `oom_kill` count) and the
attempt ends `oom`, so the job walks from the 40 GB A100 to the 80 GB one and succeeds there. Run
through `actor-run run` on the sim's sandboxes (real processes on this computer).

It needs a memory cgroup this test may make (cgroup v1's memory controller, or a v2 cgroup whose
parent delegates `memory`) and a readable kernel log or a cgroup counter that sees the kill; where the
machine allows neither it is skipped, and tests/protocols/hosts/test_oom_evidence.py still checks the
reader on the kernel's exact text. An allocation refused by `ulimit -v` is not the OOM killer, so no
such stand-in is used here."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_verdict import SIM_GPUS, Run

LIMIT = 64 << 20  # the cgroup's memory limit: the job allocates past it


def _own_cgroup() -> tuple[str, str]:
    """(v1 memory path, v2 path) of this process, from /proc/self/cgroup ("" where none)."""
    v1 = v2 = ""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v1, v2


def _make_cgroup() -> Path | None:
    """A fresh memory cgroup limited to LIMIT, or None where this machine does not let us make one."""
    name = f"actor-run-test-{uuid.uuid4().hex[:8]}"
    v1, v2 = _own_cgroup()
    tries = []
    if v1 and Path("/sys/fs/cgroup/memory").is_dir():
        tries.append((Path("/sys/fs/cgroup/memory" + v1.rstrip("/")) / name, "memory.limit_in_bytes"))
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        tries.append((Path("/sys/fs/cgroup" + v2.rstrip("/")) / name, "memory.max"))
    for path, limit in tries:
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / limit).write_text(str(LIMIT))
            return path
        except OSError:
            path.rmdir()
    return None


def _kernel_log_readable() -> bool:
    done = subprocess.run(["sh", "-c", "dmesg >/dev/null 2>&1 || journalctl -k -b -q -n 1 >/dev/null 2>&1"],
                          check=False, timeout=30)
    return done.returncode == 0


@pytest.fixture
def cgroup() -> Iterator[Path]:
    path = _make_cgroup()
    if path is None or not _kernel_log_readable():
        pytest.skip("this machine lets the test make no memory cgroup with a readable OOM record")
    try:
        yield path
    finally:
        path.rmdir()  # empty again: its one process was killed, and the wrapper reaped the job's others


# on the small GPU: into the cgroup, then allocate until the kernel's OOM killer ends it (16 MiB at a
# time, each byte written: a calloc'ed buffer that is never touched would use no memory)
OOM_KILLED_JOB = """\
if [ "$ACTOR_RUN_GPU" = A100-40G ]; then
  echo $$ > "$CGROUP/cgroup.procs" || exit 3
  exec "$PY" -c 'held = []
while True:
    held.append(b"x" * (16 << 20))'
fi
echo "fits on $ACTOR_RUN_GPU"
"""


def test_a_job_the_kernels_oom_killer_ends_is_oom_and_walks_to_the_bigger_gpu(tmp_path: Path, cgroup: Path) -> None:
    r = Run(tmp_path)
    env = f'[job.env]\nCGROUP = "{cgroup}"\nPY = "{sys.executable}"\n'
    path = r.batch(OOM_KILLED_JOB, rest=SIM_GPUS)
    path.write_text(path.read_text().replace("[policy]", env + "\n[policy]", 1))
    code, out, err = r.run(path)
    assert code == 0, err
    body = r.response()
    assert [(a["gpu"], a["failure"]) for a in body["attempts"]] == [("A100-40G", "oom"), ("A100-80G", None)]
    first = body["attempts"][0]
    assert first["exit_code"] in (137, -9)  # SIGKILL, as the shell reports it
    assert "the kernel's OOM killer ended the job" in first["reason"]
    assert "fits on A100-80G" in (tmp_path / "out" / "latest" / "v" / "seed-1" / "log.txt").read_text()
    # the kernel's own count in the cgroup: one kill (v1 memory.oom_control, v2 memory.events)
    counter = cgroup / ("memory.oom_control" if (cgroup / "memory.oom_control").exists() else "memory.events")
    kills = [line.split()[1] for line in counter.read_text().splitlines() if line.startswith("oom_kill ")]
    assert kills == ["1"]
    assert "oom: out of memory (the job exited 137)" in out
    assert os.path.exists(cgroup)


def test_the_wrappers_reader_sees_the_kill_in_its_own_cgroups_counter(cgroup: Path) -> None:
    """The wrapper's `ooms` (scripts.OOM_EVIDENCE) in a shell that is itself in the limited cgroup, as a
    wrapper is on a machine whose jobs run in one: its child is OOM-killed, and the cgroup's own count
    (v1 memory.oom_control or v2 memory.events, whichever this kernel has) moves from 0 to 1."""
    from actor_run.protocols.hosts.scripts import OOM_EVIDENCE

    script = OOM_EVIDENCE + f"""echo $$ > "{cgroup}/cgroup.procs" || exit 3
k0=$(ooms)
"{sys.executable}" -c 'held = []
while True:
    held.append(b"x" * (16 << 20))'
rc=$?
k1=$(ooms)
echo "$rc|$k0|$k1"
"""
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)
    rc, before, after = done.stdout.strip().split("|")
    assert rc == "137", done
    v2_before, v1_before = before.split(" ")[:2]  # "<v2> <v1> <kernel log lines>", an absent one ""
    v2_after, v1_after = after.split(" ")[:2]
    own = (v1_before, v1_after) if (cgroup / "memory.oom_control").exists() else (v2_before, v2_after)
    assert own == ("0", "1"), (before, after)
