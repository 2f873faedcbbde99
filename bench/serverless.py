"""HTTP calls the `runpod-serverless` cloud makes, for a batch through the real Runner against the
loopback fake (tests/fakes/runpod_serverless.py: REST v2 held to RunPod's OpenAPI document, and the
queue API, whose workers run actor-run's handler under RunPod's SDK worker loop, a process each).

    python bench/serverless.py [--batch 200] [--concurrency 50] [--poll-s 0.5] [--job-s 2]

Each job writes a progress line every 0.25 s for `--job-s` seconds. Reported (a table, then as the
LAST line one JSON object):

- per attempt on the happy path, by call: REST (catalog, create, delete, the read proving it gone)
  and queue (run, stream, health, status, cancel); `rest_per_attempt`, `queue_per_attempt`;
- `queue_calls_per_poll`: queue calls a heartbeat poll makes (`/stream`, which carries the status,
  plus `/health` while the job is queued) per `/stream`: 1.0 is one call per poll; `polls_per_attempt`;
  `queue_req_s`: the batch's queue calls per second of wall time (each to its own endpoint);
- `batch_rest_calls`: the batch's REST calls in all (what RunPod's REST rate limit, e.g. 60 a
  minute in its example policy, meters), `batch_queue_calls`;
- `succeeded` of `batch`, `endpoints_left` (must be 0).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fakes.runpod_serverless import FakeRunPodServerless  # noqa: E402
from loguru import logger  # noqa: E402

from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec  # noqa: E402
from actor_run.supervisors.api.runner import Runner  # noqa: E402


def run(batch: int, concurrency: int, poll_s: float, job_s: float) -> dict[str, object]:
    os.environ["RP_BENCH_KEY"] = "test-key"
    tmp = Path(tempfile.mkdtemp(prefix="bench-serverless-"))
    fake = FakeRunPodServerless(tmp / "fake").start()
    steps = max(1, int(job_s / 0.25))
    command = (f'i=0; while [ $i -lt {steps} ]; do echo "{{\\"stage\\": \\"train\\", \\"step\\": $i}}" '
               '>> "$ACTOR_RUN_PROGRESS"; i=$((i+1)); sleep 0.25; done')
    settings = {"image": "bench/worker:1", "rest_url": fake.url, "queue_url": fake.queue_url,
                "api_key_env": "RP_BENCH_KEY", "stream_s": min(0.25, poll_s)}
    policy = PolicySpec(poll_s=poll_s, setup_grace_s=120, stall_after_s=120, lost_after_s=120, max_attempts=1,
                        concurrency=concurrency, deadline_margin_s=600)
    try:
        with Runner(out_dir=tmp / "out", state_dir=tmp / "state", concurrency=concurrency) as runner:
            t0 = time.perf_counter()
            handles = [runner.submit(Job(name="bench", command=command, seed=s, policy=policy,
                                         candidates=[CandidateSpec(cloud="runpod-serverless", gpu="A100-80G")],
                                         clouds={"runpod-serverless": settings}))
                       for s in range(1, batch + 1)]
            ended = [h.result(3600) for h in handles]
            wall = time.perf_counter() - t0
        with fake.lock:
            rest = collections.Counter(f"{m} {t}" for m, t, _ in fake.calls)
            queue = collections.Counter(f"{m} {t}" for m, t, _ in fake.queue_calls)
        left = fake.live_endpoints()
        violations = len(fake.violations) + len(fake.queue_violations)
    finally:
        fake.stop()
    attempts = batch
    streams = queue.get("GET /v2/{endpoint}/stream/{job}", 0)
    health = queue.get("GET /v2/{endpoint}/health", 0)
    result: dict[str, object] = {
        "batch": batch, "succeeded": sum(1 for e in ended if e.outcome == "succeeded"),
        "wall_s": round(wall, 1), "poll_s": poll_s,
        "rest_per_attempt": round(sum(rest.values()) / attempts, 2),
        "queue_per_attempt": round(sum(queue.values()) / attempts, 2),
        "queue_calls_per_poll": round((streams + health) / streams, 3) if streams else 0.0,
        "polls_per_attempt": round(streams / attempts, 2),
        "queue_req_s": round(sum(queue.values()) / wall, 1),
        "batch_rest_calls": sum(rest.values()), "batch_queue_calls": sum(queue.values()),
        "endpoints_left": len(left), "violations": violations,
    }
    print(f"{'call':44} {'per attempt':>12}")
    for name, n in sorted({**rest, **queue}.items()):
        print(f"{name:44} {n / attempts:12.2f}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--poll-s", type=float, default=0.5)
    ap.add_argument("--job-s", type=float, default=2.0)
    args = ap.parse_args(argv)
    logger.remove()
    result = run(args.batch, args.concurrency, args.poll_s, args.job_s)
    print(json.dumps(result), flush=True)
    return 0 if result["succeeded"] == args.batch and result["endpoints_left"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
