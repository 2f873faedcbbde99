"""The sim's own injections for issue 43, end to end through `actor-run run` on virtual machines
(`virtual = true`, nothing runs): `oom_below_gb` has the "kernel's OOM killer" end a job on a GPU with
less memory (exit 137 and the OOM killer's line in its log, as the job's wrapper writes it on a real
machine), and `retriable_attempts = N` has each job's first N attempts flag `{"retriable": true}` and
exit 1. Every path of the verdict runs offline this way; response.json and `status --json` are read back."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_verdict import Run

# three GPU classes, the middle one smaller than the first (clouds/gpus.py: 40, 24 and 80 GB)
SIM = """\
[clouds.sim]
virtual = true
virtual_job_s = 0.3
launch_latency_s = 0.05
delete_latency_s = 0.01
{extra}
[[clouds.sim.regions]]
name = "us-east"
[clouds.sim.regions.gpus]
A100-40G = {{ stock = 2, hourly_usd = 1.1 }}
RTX4090 = {{ stock = 2, hourly_usd = 0.4 }}
A100-80G = {{ stock = 2, hourly_usd = 1.8 }}
{candidates}"""


def candidates(*gpus: str) -> str:
    return "".join(f'[[candidates]]\ncloud = "sim"\ngpu = "{g}"\n' for g in gpus)


@pytest.fixture
def r(tmp_path: Path) -> Run:
    return Run(tmp_path)


def test_oom_below_gb_walks_from_the_small_gpu_past_a_smaller_one_to_a_bigger_one_and_succeeds(r: Run) -> None:
    rest = SIM.format(extra="oom_below_gb = 80", candidates=candidates("A100-40G", "RTX4090", "A100-80G"))
    code, out, err = r.run(r.batch("true\n", rest=rest))
    assert code == 0, err
    body = r.response()
    assert body["outcome"] == "succeeded"
    assert [(a["gpu"], a["failure"]) for a in body["attempts"]] == [("A100-40G", "oom"), ("A100-80G", None)]
    # judged from the exit status (137) and the OOM killer's line the machine's wrapper wrote
    assert "the kernel's OOM killer ended the job" in body["attempts"][0]["reason"]
    assert "sim: A100-40G has 40 GB" in body["attempts"][0]["reason"]
    assert body["counts"]["failures"] == {"used": 1, "limit": 3}
    assert "oom: out of memory (the job exited 137): actor-run: the kernel's OOM killer ended the job" in out
    job = r.status_job()
    assert job["state"] == "succeeded"
    assert "OOM killer" in job["reason"]


def test_oom_below_gb_with_on_oom_fail_ends_the_job_oom_after_one_attempt(r: Run) -> None:
    rest = SIM.format(extra="oom_below_gb = 80", candidates=candidates("A100-40G", "A100-80G"))
    code, _, _ = r.run(r.batch("true\n", 'on_oom = "fail"\n', rest=rest))
    assert code == 1
    body = r.response()
    assert (body["outcome"], body["failure"], len(body["attempts"])) == ("failed", "oom", 1)
    assert 'on_oom = "fail"' in body["detail"]
    job = r.status_job()
    assert (job["state"], job["failure"]) == ("failed", "oom")


def test_oom_below_gb_with_nothing_bigger_left_ends_the_job_oom(r: Run) -> None:
    rest = SIM.format(extra="oom_below_gb = 100", candidates=candidates("RTX4090", "A100-40G"))
    code, _, _ = r.run(r.batch("true\n", rest=rest))
    assert code == 1
    body = r.response()
    # up the ladder (24, then 40 GB), each OOM-killed, then no candidate is bigger than the 40 GB one
    assert [(a["gpu"], a["failure"]) for a in body["attempts"]] == [("RTX4090", "oom"), ("A100-40G", "oom")]
    assert body["failure"] == "oom"
    assert "no candidate has more GPU memory than A100-40G" in body["detail"]
    assert r.status_job()["failure"] == "oom"


def test_retriable_attempts_flag_the_first_attempts_retriable_then_the_job_succeeds(r: Run) -> None:
    rest = SIM.format(extra="retriable_attempts = 2", candidates=candidates("A100-80G"))
    code, out, err = r.run(r.batch("true\n", "max_retriable = 3\n", rest=rest))
    assert code == 0, err
    body = r.response()
    assert [a["failure"] for a in body["attempts"]] == ["retriable", "retriable", None]
    assert body["attempts"][0]["reason"] == "sim: an injected NCCL error"
    assert body["counts"]["retriable"] == {"used": 2, "limit": 3}
    job = r.status_job()
    assert job["counts"]["retriable"] == {"used": 2, "limit": 3}
    assert job["counts"]["failures"] == {"used": 0, "limit": 3}
    assert job["reason"] == "sim: an injected NCCL error"
    assert "[retriable 2/3]" in out  # the plain live view's lines say the budget as it is drawn on
