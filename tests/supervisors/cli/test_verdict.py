"""The job's own verdict through `actor-run run` (issue 43): a job that flags its failure retriable
(or exits with a code in `retry_on_exit`) is retried on a fresh machine; one that runs out of memory
moves to a candidate with more GPU memory (`on_oom`); preemptions draw on a budget of their own.
Each run as a user would, on the local cloud or the sim's sandboxes; the plain live view (stdout off
a terminal), `status --json`, `--json` events and response.json are read back."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.cli_inproc import run_cli

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}

RETRIABLE_JOB = """\
if [ "$ACTOR_RUN_ATTEMPT" = 0 ]; then
  echo '{"retriable": true, "reason": "NCCL error: unhandled system error"}' >> "$ACTOR_RUN_PROGRESS"
  exit 1
fi
echo fine
"""

# PyTorch's message as c10/cuda/CUDACachingAllocator.cpp raises it, on the small GPU only
OOM_JOB = """\
if [ "$ACTOR_RUN_GPU" = A100-40G ]; then
  echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has 39.39 GiB.' >&2
  exit 1
fi
echo "fits on $ACTOR_RUN_GPU"
"""

SIM_GPUS = """\
[clouds.sim]
launch_latency_s = 0.05
delete_latency_s = 0.01
[[clouds.sim.regions]]
name = "us-east"
[clouds.sim.regions.gpus]
A100-40G = { stock = 2, hourly_usd = 1.1 }
RTX4090 = { stock = 2, hourly_usd = 0.4 }
A100-80G = { stock = 2, hourly_usd = 1.8 }

[[candidates]]
cloud = "sim"
gpu = "A100-40G"
[[candidates]]
cloud = "sim"
gpu = "RTX4090"
[[candidates]]
cloud = "sim"
gpu = "A100-80G"
"""


class Run:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.common = ["--state-dir", str(tmp / "state"), "--ledger", str(tmp / "ledger.sqlite")]

    def batch(self, script: str, policy: str = "", rest: str = "") -> Path:
        code = self.tmp / "code"
        code.mkdir(exist_ok=True)
        (code / "job.sh").write_text(script)
        path = self.tmp / "batch.toml"
        path.write_text(textwrap.dedent("""\
            [job]
            name = "v"
            command = "sh job.sh"
            code = "code"
            seeds = [1]

            [policy]
            poll_s = 0.1
            backoff_s = 0.0
            """) + policy + "\n" + rest)
        return path

    def run(self, path: Path, *extra: str) -> tuple[int, str, str]:
        done = run_cli(["run", str(path), *self.common, "--out", str(self.tmp / "out"), *extra], timeout=240, env=ENV)
        return done.returncode, done.stdout, done.stderr

    def response(self) -> dict[str, Any]:
        body: dict[str, Any] = json.loads((self.tmp / "out" / "latest" / "v" / "seed-1" / "response.json").read_text())
        return body

    def status_job(self) -> dict[str, Any]:
        done = run_cli(["status", "--json", *self.common], timeout=60, env=ENV)
        assert done.returncode == 0, done.stderr
        jobs = [d for d in map(json.loads, done.stdout.splitlines()) if d["kind"] == "job"]
        assert len(jobs) == 1
        return jobs[0]

    def status_text(self) -> str:
        done = run_cli(["status", *self.common], timeout=60, env=ENV)
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture
def r(tmp_path: Path) -> Run:
    return Run(tmp_path)


def test_a_job_that_flags_retriable_and_exits_1_succeeds_on_its_second_attempt(r: Run) -> None:
    code, out, err = r.run(r.batch(RETRIABLE_JOB))
    assert code == 0, err
    body = r.response()
    assert body["outcome"] == "succeeded"
    assert [a["failure"] for a in body["attempts"]] == ["retriable", None]
    assert body["attempts"][0]["reason"] == "NCCL error: unhandled system error"
    assert "NCCL error: unhandled system error" in body["attempts"][0]["detail"]
    assert body["counts"]["failures"] == {"used": 1, "limit": 3}  # drawn from max_attempts
    # the plain live view (stdout off a terminal) said why it was retried
    assert "retriable: the job flagged retriable (exited 1): NCCL error: unhandled system error" in out
    job = r.status_job()
    assert job["reason"] == "NCCL error: unhandled system error"
    assert job["counts"]["failures"] == {"used": 1, "limit": 3}
    assert job["counts"]["preemptions"] == {"used": 0, "limit": 10}
    text = r.status_text()
    assert "last retried for: NCCL error: unhandled system error" in text
    assert "failures 1/3" in text


def test_a_job_that_flags_retriable_and_exits_0_succeeded(r: Run) -> None:
    script = """echo '{"retriable": true, "reason": "said, but exited 0"}' >> "$ACTOR_RUN_PROGRESS"\nexit 0\n"""
    code, _, err = r.run(r.batch(script))
    assert code == 0, err
    assert [a["failure"] for a in r.response()["attempts"]] == [None]


def test_an_exit_code_in_retry_on_exit_is_retried_and_json_events_say_so(r: Run) -> None:
    script = 'if [ "$ACTOR_RUN_ATTEMPT" = 0 ]; then exit 75; fi\necho fine\n'
    code, out, err = r.run(r.batch(script, "retry_on_exit = [75]\nmax_retriable = 2\n"), "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    ended = [e for e in events if e["type"] == "AttemptEnded"]
    assert [e["failure"] for e in ended] == ["retriable", None]
    assert "the job exited 75, listed in retry_on_exit" in ended[0]["detail"]
    assert [e["failure"] for e in events if e["type"] == "Retrying"] == ["retriable"]
    # the retry's event carries each budget's count, this failure counted (the live view shows them)
    assert [e["counts"] for e in events if e["type"] == "Retrying"] == [
        {"failures": {"used": 0, "limit": 3}, "preemptions": {"used": 0, "limit": 10},
         "retriable": {"used": 1, "limit": 2}}]
    assert [e["counts"]["retriable"] for e in events if e["type"] == "JobEnded"] == [{"used": 1, "limit": 2}]
    body = r.response()
    assert body["outcome"] == "succeeded"
    assert body["counts"]["retriable"] == {"used": 1, "limit": 2}  # its own budget, not max_attempts'
    assert body["counts"]["failures"] == {"used": 0, "limit": 3}


def test_without_retry_on_exit_the_same_exit_is_the_jobs_own_failure(r: Run) -> None:
    script = 'if [ "$ACTOR_RUN_ATTEMPT" = 0 ]; then exit 75; fi\necho fine\n'
    code, _, _ = r.run(r.batch(script))
    assert code == 1
    assert (r.response()["failure"], len(r.response()["attempts"])) == ("job_failed", 1)


def test_pytorch_out_of_memory_on_an_a100_40g_moves_past_a_smaller_gpu_to_the_a100_80g(r: Run) -> None:
    code, out, err = r.run(r.batch(OOM_JOB, rest=SIM_GPUS))
    assert code == 0, err
    body = r.response()
    assert body["outcome"] == "succeeded"
    got = [(a["gpu"], a["failure"]) for a in body["attempts"]]
    assert got == [("A100-40G", "oom"), ("A100-80G", None)]  # the RTX4090 listed between them: skipped
    assert "CUDA out of memory. Tried to allocate 20.00 GiB" in body["attempts"][0]["reason"]
    assert body["counts"]["failures"] == {"used": 1, "limit": 3}
    assert "fits on A100-80G" in (r.tmp / "out" / "latest" / "v" / "seed-1" / "log.txt").read_text()
    assert "oom: out of memory (the job exited 1): torch.OutOfMemoryError: CUDA out of memory" in out
    job = r.status_job()
    assert "CUDA out of memory" in job["reason"]


def test_on_oom_fail_ends_the_job_oom_after_one_attempt(r: Run) -> None:
    code, out, _ = r.run(r.batch(OOM_JOB, 'on_oom = "fail"\n', rest=SIM_GPUS))
    assert code == 1
    body = r.response()
    assert (body["outcome"], body["failure"], len(body["attempts"])) == ("failed", "oom", 1)
    assert "oom" in out
    job = r.status_job()
    assert (job["state"], job["failure"]) == ("failed", "oom")


def test_nothing_bigger_left_ends_oom(r: Run) -> None:
    rest = SIM_GPUS.replace('gpu = "A100-80G"', 'gpu = "A100-40G"')
    code, _, _ = r.run(r.batch(OOM_JOB, rest=rest))
    assert code == 1
    body = r.response()
    assert (body["failure"], len(body["attempts"])) == ("oom", 1)
    assert "no candidate has more GPU memory than A100-40G" in body["detail"]


def test_three_preemptions_with_max_attempts_3_and_a_budget_of_5_succeed_on_the_fourth_machine(r: Run) -> None:
    script = 'if [ "$ACTOR_RUN_ATTEMPT" -lt 3 ]; then sleep 60; fi\necho "done on attempt $ACTOR_RUN_ATTEMPT"\n'
    rest = textwrap.dedent("""\
        [clouds.sim]
        launch_latency_s = 0.05
        delete_latency_s = 0.01
        preempt_attempts = 3
        preempt_within_s = 3.0

        [[candidates]]
        cloud = "sim"
        """)
    code, out, err = r.run(r.batch(script, "max_attempts = 3\nmax_preemptions = 5\n", rest=rest))
    assert code == 0, err
    # the plain live view's lines say the budget drawn on, against its limit, as the retries come
    assert "[preemptions 1/5]" in out
    assert "[preemptions 3/5]" in out.splitlines()[-1] or any(
        "succeeded" in line and "[preemptions 3/5]" in line for line in out.splitlines())
    body = r.response()
    assert [a["failure"] for a in body["attempts"]] == ["preempted", "preempted", "preempted", None]
    assert body["counts"]["preemptions"] == {"used": 3, "limit": 5}
    assert body["counts"]["failures"] == {"used": 0, "limit": 3}
    job = r.status_job()
    assert job["counts"]["preemptions"] == {"used": 3, "limit": 5}
    assert "preemptions 3/5" in r.status_text()


def test_a_preemption_budget_still_ends_the_job_past_it(r: Run) -> None:
    rest = textwrap.dedent("""\
        [clouds.sim]
        launch_latency_s = 0.05
        delete_latency_s = 0.01
        preempt_attempts = 9
        preempt_within_s = 3.0

        [[candidates]]
        cloud = "sim"
        """)
    code, _, _ = r.run(r.batch("sleep 60\n", "max_attempts = 9\nmax_preemptions = 1\n", rest=rest))
    assert code == 1
    body = r.response()
    assert (body["failure"], len(body["attempts"])) == ("preempted", 2)
    assert "2 preemptions (max_preemptions = 1)" in body["detail"]


def test_the_example_runs_every_path_and_plan_shows_the_escalation(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "verdict.toml"
    common = ["--state-dir", str(tmp_path / "state"), "--ledger", str(tmp_path / "ledger.sqlite")]
    plan = run_cli(["plan", str(example), "--state-dir", str(tmp_path / "state")], timeout=60, env=ENV)
    assert plan.returncode == 0, plan.stderr
    assert "candidate 0 A100-40G (40 GB) -> candidate 2 A100-80G (80 GB)" in plan.stdout
    done = run_cli(["run", str(example), *common, "--out", str(tmp_path / "out")], timeout=240, env=ENV)
    assert done.returncode == 0, done.stderr
    for seed in (1, 2):
        body = json.loads((tmp_path / "out" / "latest" / "verdict" / f"seed-{seed}" / "response.json").read_text())
        assert [a["failure"] for a in body["attempts"]] == ["preempted", "retriable", "oom", None]
        assert body["attempts"][-1]["gpu"] == "A100-80G"
        assert body["counts"]["preemptions"] == {"used": 1, "limit": 5}
        assert body["counts"]["retriable"] == {"used": 1, "limit": 2}
