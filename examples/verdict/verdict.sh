#!/bin/sh
# A job that gives its own verdict (see examples/verdict.toml).
echo '{"stage": "train", "step": 0, "total": 2}' >> "$ACTOR_RUN_PROGRESS"
if [ "$ACTOR_RUN_ATTEMPT" = 0 ]; then
  sleep 30  # the sim preempts this machine meanwhile
fi
if [ "$ACTOR_RUN_ATTEMPT" = 1 ]; then
  # the machine's fault, not the code's: say so before exiting non-zero
  echo '{"retriable": true, "reason": "NCCL error: unhandled system error"}' >> "$ACTOR_RUN_PROGRESS"
  exit 1
fi
if [ "$ACTOR_RUN_GPU" = A100-40G ]; then
  # what PyTorch prints when the GPU is too small (c10/cuda/CUDACachingAllocator.cpp)
  echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB.' >&2
  exit 1
fi
echo "{\"stage\": \"train\", \"step\": 2, \"total\": 2, \"gpu\": \"$ACTOR_RUN_GPU\"}" >> "$ACTOR_RUN_PROGRESS"
echo "trained on $ACTOR_RUN_GPU" > "$ACTOR_RUN_OUT/result.txt"
