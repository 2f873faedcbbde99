"""A small example job: "trains" for a few steps, reports progress, writes outputs.

It reads its input through $ACTOR_RUN_IN, writes to $ACTOR_RUN_OUT, and appends progress lines
(JSON) to $ACTOR_RUN_PROGRESS, as any job run by actor-run may.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.3)
args = parser.parse_args()

progress = Path(os.environ["ACTOR_RUN_PROGRESS"])
out = Path(os.environ["ACTOR_RUN_OUT"])
data = Path(os.environ["ACTOR_RUN_IN"]) / "data" / "train.txt"


def report(**line):
    with progress.open("a") as f:
        f.write(json.dumps(line) + "\n")


report(stage="setup")
words = data.read_text().split()
print(f"seed {args.seed}: {len(words)} words of training data (attempt {os.environ['ACTOR_RUN_ATTEMPT']})")
rng = random.Random(args.seed)
loss = 2.0
for step in range(1, args.steps + 1):
    time.sleep(args.step_seconds)
    loss *= 0.7 + 0.2 * rng.random()
    report(stage="train", step=step, total=args.steps, loss=round(loss, 4))
    print(f"step {step}: loss {loss:.4f}", flush=True)
(out / "model.json").write_text(json.dumps({"seed": args.seed, "loss": loss, "vocab": len(set(words))}))
report(stage="done", loss=round(loss, 4))
print("done")
