"""protocols/verdict.py: what a failed attempt's job said of its failure."""

from __future__ import annotations

import pytest

from actor_run.protocols.failures import Code
from actor_run.protocols.verdict import OOM_KILLER_LINE, REASON_MAX, judge, oom_line

# Each framework's message as its own source builds it, in the traceback's last line a job's log ends with
# (the values in them are examples; the text around them is the source's):
MESSAGES = [
    # PyTorch >= 2.1, c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc):
    # TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", format_size(alloc_size),
    # ". GPU ", device, " has a total capacity of ", format_size(device_total), " of which ",
    # format_size(device_free), " is free. ", proc_info, ...), raised in Python as torch.OutOfMemoryError
    pytest.param(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                 b"capacity of 39.39 GiB of which 12.44 MiB is free. Including non-PyTorch memory, this process "
                 b"has 39.37 GiB memory in use.", id="pytorch"),
    # PyTorch 1.13-2.0, the same file: TORCH_CHECK_WITH(CUDAOutOfMemoryError, false, "CUDA out of memory. Tried
    # to allocate ", format_size(alloc_size), " (GPU ", device, "; ", format_size(device_total), " total capacity; ",
    # ..., " already allocated; ", ..., " free; ", ..., " reserved in total by PyTorch)"), torch.cuda.OutOfMemoryError
    pytest.param(b"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 15.78 GiB "
                 b"total capacity; 14.21 GiB already allocated; 1.19 MiB free; 14.57 GiB reserved in total by "
                 b"PyTorch)", id="pytorch-1.13"),
    # CUDA itself, through PyTorch's C10_CUDA_CHECK: c10/cuda/CUDAException.cpp c10_cuda_check_implementation
    # appends "CUDA error: " and cudaGetErrorString(err), which for cudaErrorMemoryAllocation (2) is "out of
    # memory" (CUDA Runtime API, enum cudaError); raised as a RuntimeError (torch.AcceleratorError from 2.8)
    pytest.param(b"RuntimeError: CUDA error: out of memory", id="cuda"),
    # JAX (XLA's GPU allocator): xla/stream_executor/integrations/tf_allocator_adapter.cc MemoryAllocationError,
    # absl::ResourceExhaustedError(absl::StrCat("Out of ", "", "memory while trying to allocate ", size,
    # " bytes.")), which absl::Status prints "RESOURCE_EXHAUSTED: <message>"; raised as XlaRuntimeError
    pytest.param(b"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
                 b"allocate 17179869184 bytes.", id="jax"),
    # TensorFlow, tensorflow/core/framework/op_kernel.cc OpKernelContext::allocate_tensor:
    # errors::ResourceExhausted("OOM when allocating tensor with shape", shape.DebugString(), " and type ",
    # DataTypeString(type), " on ", params_->device->name(), " by allocator ", a->Name()), raised in Python as
    # tf.errors.ResourceExhaustedError (tensorflow/python/framework/errors_impl.py)
    pytest.param(b"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
                 b"shape[32,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator "
                 b"GPU_0_bfc", id="tensorflow"),
]


@pytest.mark.parametrize("message", MESSAGES)
def test_each_frameworks_message_is_out_of_memory(message: bytes) -> None:
    tail = b"step 1\nTraceback (most recent call last):\n  File \"train.py\", line 9\n" + message + b"\n"
    assert oom_line(tail, 1) == message.decode()[:REASON_MAX]
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


def test_an_ordinary_failure_or_a_host_memory_error_is_not_out_of_gpu_memory() -> None:
    """What must not walk to a bigger GPU: a job's own error, and XLA's host-memory variant of its
    message (the same function, "Out of host memory while trying to allocate ...": more GPU memory
    would not help)."""
    assert oom_line(b"ValueError: bad shape\n", 1) == ""
    assert oom_line(b"XlaRuntimeError: RESOURCE_EXHAUSTED: Out of host memory while trying to allocate 8 bytes.\n",
                    1) == ""
