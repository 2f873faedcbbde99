"""The job's own verdict on a failed attempt: out of memory (`oom`), "not my fault, retry me"
(`retriable`), or its own failure (`job_failed`). Pure functions, no I/O.

What it is judged from, all of it read by the heartbeat (actors/heartbeat.py):
- progress lines (`$ACTOR_RUN_PROGRESS`): `{"retriable": true, "reason": "..."}` or `{"oom": true}`,
  the last one of each kind counts;
- the last `TAIL_BYTES` of the job's log: an out-of-memory message of CUDA, PyTorch, JAX/XLA or
  TensorFlow (`OOM_MESSAGES`), or the line the job's wrapper writes when the kernel's OOM killer
  ended the job (`OOM_KILLER_LINE`: the exit status was 137 and the machine's own count of OOM
  kills moved while it ran: `oom_kill` of the wrapper's cgroup, v2's memory.events or v1's
  memory.oom_control, or the OOM killer's lines in the kernel log, by dmesg or journalctl -k where
  readable; protocols/hosts/scripts.py OOM_EVIDENCE, which cites the kernel's sources);
- the exit code, and the policy's `retry_on_exit`.
A job that exits 0 succeeded, whatever it flagged.
"""

from __future__ import annotations

from collections.abc import Collection

from actor_run.protocols.failures import Code

TAIL_BYTES = 16 << 10  # the log's last bytes searched for an out-of-memory message
REASON_MAX = 300  # characters of a reason or a matched line kept

# The messages the frameworks themselves print, as their sources spell them:
# - PyTorch, c10/cuda/CUDACachingAllocator.cpp: TORCH_CHECK_WITH(OutOfMemoryError, false,
#   "CUDA out of memory. Tried to allocate ", format_size(alloc_size), ...), raised in Python as
#   `torch.OutOfMemoryError` (`torch.cuda.OutOfMemoryError` before 2.5, still an alias), so a
#   traceback ends "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ...";
# - CUDA itself: cudaGetErrorString(cudaErrorMemoryAllocation) is "out of memory", which PyTorch's
#   C10_CUDA_CHECK prints as "CUDA error: out of memory";
# - JAX (XLA's allocators): an absl RESOURCE_EXHAUSTED status, printed "RESOURCE_EXHAUSTED: Out of
#   memory while trying to allocate N bytes." (openxla/xla docs/errors list the RESOURCE_EXHAUSTED family);
# - TensorFlow, tensorflow/core/framework/op_kernel.cc (OpKernelContext::allocate_tensor):
#   errors::ResourceExhausted("OOM when allocating tensor with shape", ...), raised in Python as
#   `tf.errors.ResourceExhaustedError` (tensorflow/python/framework/errors_impl.py).
OOM_MESSAGES: tuple[bytes, ...] = (
    b"CUDA out of memory",
    b"torch.OutOfMemoryError",
    b"torch.cuda.OutOfMemoryError",
    b"CUDA error: out of memory",
    b"RESOURCE_EXHAUSTED: Out of memory",
    b"OOM when allocating tensor",
)
# written by the job's wrapper (protocols/hosts/scripts.py) after an exit 137 with the machine's evidence
OOM_KILLER_LINE = b"actor-run: the kernel's OOM killer ended the job"
OOM_KILLED_EXITS = frozenset({137, -9})  # 128 + SIGKILL as a shell reports it; -9 as a Python parent does


def oom_line(tail: bytes, exit_code: int) -> str:
    """The log line that says the job ran out of memory ("" when none does): a framework's own
    message, or, after an exit by SIGKILL, the wrapper's line naming the OOM killer's evidence."""
    lines = tail.splitlines()
    for raw in reversed(lines):
        if OOM_KILLER_LINE in raw and exit_code in OOM_KILLED_EXITS:
            return _text(raw)
    for raw in reversed(lines):
        if any(m in raw for m in OOM_MESSAGES):
            return _text(raw)
    return ""


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip()[:REASON_MAX]


def judge(exit_code: int, *, retry_on_exit: Collection[int] = (), retriable: bool = False, reason: str = "",
          oom: str = "") -> tuple[Code | None, str]:
    """What an attempt whose job exited `exit_code` ended with: (None, "") for a success, else the
    failure code and its detail. `retriable`/`reason`: the job's progress flag; `oom`: the
    evidence of an out-of-memory end (a log line, or the job's own `{"oom": true}`)."""
    if exit_code == 0:
        return None, ""
    if oom:
        return Code.OOM, f"out of memory (the job exited {exit_code}): {oom}"
    if retriable:
        return Code.RETRIABLE, f"the job flagged retriable (exited {exit_code}): {reason or 'no reason given'}"
    if exit_code in retry_on_exit:
        return Code.RETRIABLE, f"the job exited {exit_code}, listed in retry_on_exit"
    return Code.JOB_FAILED, f"the job exited {exit_code}"


__all__ = ["OOM_KILLER_LINE", "OOM_MESSAGES", "TAIL_BYTES", "judge", "oom_line"]
