"""protocols/verdict.py: what a failed attempt's job said of its failure."""

from __future__ import annotations

import pytest

from actor_run.protocols.failures import Code
from actor_run.protocols.verdict import OOM_KILLER_LINE, judge, oom_line

# as each framework prints it (the sources are cited beside OOM_MESSAGES)
MESSAGES = [
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39 GiB",
    b"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.78 GiB)",
    b"RuntimeError: CUDA error: out of memory",
    b"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 3376 bytes.",
    b"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[32,64]",
]


@pytest.mark.parametrize("message", MESSAGES)
def test_each_frameworks_message_is_out_of_memory(message: bytes) -> None:
    tail = b"step 1\n" + message + b"\nTraceback ends\n"
    assert oom_line(tail, 1) == message.decode()
    code, detail = judge(1, oom=oom_line(tail, 1))
    assert code is Code.OOM
    assert message.decode()[:40] in detail


def test_the_oom_killers_line_counts_only_after_a_sigkill() -> None:
    tail = b"loading\n" + OOM_KILLER_LINE + b" (OOM kills: 0 before, 1 after)\n"
    assert oom_line(tail, 137).startswith(OOM_KILLER_LINE.decode())
    assert oom_line(tail, 1) == ""
    assert oom_line(b"an ordinary error\n", 137) == ""


def test_judge_orders_oom_then_the_flag_then_retry_on_exit() -> None:
    assert judge(0, retriable=True, oom="x") == (None, "")  # exit 0 succeeded, whatever it flagged
    assert judge(1, retriable=True, reason="NCCL", oom="CUDA out of memory")[0] is Code.OOM
    assert judge(1, retriable=True, reason="NCCL") == (Code.RETRIABLE,
                                                       "the job flagged retriable (exited 1): NCCL")
    assert judge(75, retry_on_exit=[75])[0] is Code.RETRIABLE
    assert judge(75) == (Code.JOB_FAILED, "the job exited 75")
