"""The machine a job gets, checked before anything is uploaded: its GPUs and its clock.

At the first connect of a machine that promises a GPU (a rented cloud's, an SSH host that declares
`gpus`), the lease runs one script on it: `nvidia-smi --query-gpu=name --format=csv,noheader` must
list at least the asked count of the asked class (names matched through clouds/gpus.py `SMI_NAMES`),
and `date +%s` must be within `max_skew_s` (60 s) of the controller's clock (the machine's deadline
is a clock time: a skewed clock fires its self-delete early or never). Both commands are resolved on
the login's PATH, as the job's own would be. A machine that fails is refused: `Refused(launch_failed)`
naming what was wrong; the lease deletes it and the job walks on. The check costs one command on the
connection already open (a few milliseconds on a persistent shell, plus nvidia-smi's own start: about
0.1 to 1 s on a machine whose driver is loaded) and no upload.

A cloud says what it checks with `machine_check(offer)` (a `MachineCheck`, or None for nothing): its
setting `check_gpu = false` turns the GPU half off for an image without nvidia-smi; the clock is
checked wherever the machine is not this computer.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from actor_run.protocols.clouds.gpus import gpu_class, gpu_count, smi_matches
from actor_run.protocols.failures import Code, Refused

SMI = "nvidia-smi --query-gpu=name --format=csv,noheader"
MARK = "actor-run-check"


class MachineCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What to check on a new machine: `gpu` (a shape, `A100:8`) when `check_gpu`, its clock when
    `check_clock`, within `max_skew_s` of ours."""

    gpu: str = ""
    check_gpu: bool = True
    check_clock: bool = True
    max_skew_s: float = 60.0


def check_script(want: MachineCheck) -> str:
    """POSIX sh printing the GPU names (when asked), nvidia-smi's exit and the machine's clock; it always exits 0."""
    lines = []
    if want.check_gpu:
        lines.append(f"{SMI} 2>&1; echo \"{MARK} smi-exit $?\"")
    if want.check_clock:
        lines.append(f"echo \"{MARK} clock $(date +%s)\"")
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


def judge(want: MachineCheck, output: str, before: float, after: float) -> str:
    """What is wrong with the machine from the script's `output` ("" when nothing): `before` and
    `after` are the controller's clock around the call (a slow call widens the tolerance)."""
    names: list[str] = []
    smi_exit: int | None = None
    clock: float | None = None
    for line in output.splitlines():
        if line.startswith(f"{MARK} smi-exit "):
            smi_exit = int(line.split()[-1]) if line.split()[-1].isdigit() else -1
        elif line.startswith(f"{MARK} clock "):
            try:
                clock = float(line.split()[-1])
            except ValueError:
                clock = None
        elif line.strip():
            names.append(line.strip())
    problems = []
    if want.check_gpu:
        asked, count = gpu_class(want.gpu), gpu_count(want.gpu)
        if smi_exit != 0:
            said = "; ".join(names)[:200] or "no output"
            problems.append(f"nvidia-smi sees no NVIDIA GPU (exit {smi_exit}: {said})")
        else:
            fit = [n for n in names if smi_matches(n, asked)]
            if len(fit) < count:
                listed = ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names)) or "none"
                problems.append(f"nvidia-smi lists {len(fit)} {asked or 'GPU'}{'s' if len(fit) != 1 else ''}, "
                                f"{count} asked (it lists: {listed})")
    if want.check_clock:
        if clock is None:
            problems.append("its clock could not be read (date +%s)")
        else:
            slack = want.max_skew_s + (after - before) / 2 + 1  # date +%s is whole seconds
            skew = clock - (before + after) / 2
            if abs(skew) > slack:
                problems.append(f"its clock is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the "
                                f"controller's (at most {want.max_skew_s:g} s)")
    return "; ".join(problems)


async def verify_machine(workspace: Any, want: MachineCheck, name: str) -> None:
    """Run the check on `workspace` (a workspace with a `host`; one without, a virtual machine or a
    queue, has nothing to check) and raise `Refused(launch_failed)` naming what is wrong. Reactor thread."""
    host = getattr(workspace, "host", None)
    if host is None or not (want.check_gpu or want.check_clock):
        return
    before = time.time()
    res = await host.run(check_script(want), timeout=60.0)
    after = time.time()
    problem = judge(want, res.text(), before, after)
    if problem:
        raise Refused(Code.LAUNCH_FAILED, f"{name}: the machine failed its check before the job: {problem}")


__all__ = ["MachineCheck", "check_script", "judge", "verify_machine"]
