"""runpod-serverless end to end through the Runner (and the CLI for kill -9 and resume), against the
loopback fake whose workers run actor-run's handler for real: the job's output comes home, a
throttled GPU class walks to the next, a handler error is final, and a controller killed mid-job is
followed to the job's end by its recorded handle (never submitted twice), leaving no endpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil
import pytest
from fakes.runpod_serverless import FakeRunPodServerless, serving
from fakes.runpod_serverless import settings as serverless
from support.cli_inproc import CLI, run_cli

from actor_run.protocols.failures import Code
from actor_run.protocols.messages import AttemptEnded, Exited
from actor_run.protocols.serverless import INLINE_LIMIT
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.ledger import Ledger, LedgerReader

FAST = PolicySpec(poll_s=0.1, backoff_s=0.01, backoff_max_s=0.05, setup_grace_s=30, stall_after_s=30,
                  lost_after_s=30, max_attempts=3, deadline_margin_s=60, last_grace_factor=1.0)
TRAIN = ('echo "{\\"stage\\": \\"train\\", \\"seed\\": $ACTOR_RUN_SEED}" >> "$ACTOR_RUN_PROGRESS"; '
         'cat "$ACTOR_RUN_IN/words/words.txt" > "$ACTOR_RUN_OUT/result.txt"; sh step.sh; echo "done $ACTOR_RUN_SEED"')


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runpod_zygote: Any) -> Iterator[FakeRunPodServerless]:
    monkeypatch.setenv("RP_TEST_KEY", "test-key")
    with serving(tmp_path / "fake") as server:
        yield server



def job(fake: FakeRunPodServerless, tmp_path: Path, *, gpus: tuple[str, ...] = ("A100-80G",), command: str = TRAIN,
        seed: int = 3, settings: dict[str, Any] | None = None) -> Job:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "step.sh").write_text("echo stepping\n")
    words = tmp_path / "words.txt"
    words.write_text("alpha beta\n")
    return Job(name="sls", command=command, seed=seed, code=str(code), inputs={"words": str(words)}, policy=FAST,
               candidates=[CandidateSpec(cloud="runpod-serverless", gpu=g) for g in gpus],
               clouds={"runpod-serverless": serverless(fake, **(settings or {}))})


def test_a_job_runs_on_a_queue_worker_and_its_output_comes_home(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], events: Any, tmp_path: Path,
) -> None:
    with open_runner() as r:
        ended = r.submit(job(fake, tmp_path)).result(60)
    assert (ended.outcome, ended.attempts) == ("succeeded", 1), ended.detail
    seed_dir = tmp_path / "out" / "latest" / "sls" / "seed-3"
    assert (seed_dir / "out" / "result.txt").read_text() == "alpha beta\n"
    assert json.loads((seed_dir / "progress.jsonl").read_text()) == {"stage": "train", "seed": 3}
    log = (seed_dir / "log.txt").read_text()
    assert "stepping" in log
    assert "done 3" in log
    # billed: the pool's per-second price times the worker's execution time, not the endpoint's life
    (attempt,) = events.of(AttemptEnded)
    (exited,) = events.of(Exited)
    assert exited.billed_s >= 0
    assert attempt.usage.seconds == pytest.approx(exited.billed_s)
    assert attempt.usage.usd == pytest.approx(2.72 * exited.billed_s / 3600)
    assert len(fake.submitted) == 1
    assert fake.live_endpoints() == []


def test_throttled_workers_walk_to_the_next_gpu_class(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], events: Any, tmp_path: Path,
) -> None:
    fake.throttled.add("AMPERE_80")
    spec = job(fake, tmp_path, gpus=("A100-80G", "H100"), settings={"throttled_grace_s": 0.3})
    with open_runner() as r:
        ended = r.submit(spec).result(60)
    assert ended.outcome == "succeeded", ended.detail
    first, second = events.of(AttemptEnded)
    assert (first.failure, first.offer.gpu) == (Code.NO_CAPACITY, "A100-80G")
    assert (second.outcome, second.offer.gpu) == ("succeeded", "H100")
    assert fake.live_endpoints() == []


def test_a_non_zero_exit_is_final_with_its_output(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], tmp_path: Path,
) -> None:
    spec = job(fake, tmp_path, command='echo half > "$ACTOR_RUN_OUT/half.txt"; exit 4')
    with open_runner() as r:
        ended = r.submit(spec).result(60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("failed", Code.JOB_FAILED, 1)
    assert (tmp_path / "out" / "latest" / "sls" / "seed-3" / "out" / "half.txt").read_text() == "half\n"
    assert len(fake.submitted) == 1  # final: not retried
    assert fake.live_endpoints() == []


def test_kill_9_mid_job_then_resume_follows_the_job_by_its_handle(
    fake: FakeRunPodServerless, tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    spec = job(fake, tmp_path, command=f'while [ ! -e {gate} ]; do sleep 0.05; done; echo fin > "$ACTOR_RUN_OUT/f.txt"')
    batch = tmp_path / "batch.toml"
    settings = "\n".join(f"{k} = {json.dumps(v)}" for k, v in spec.clouds["runpod-serverless"].items())
    batch.write_text(f"""
[job]
name = "sls"
command = {json.dumps(spec.command)}
code = "code"
seeds = [3]
timeout_s = 120

[policy]
poll_s = 0.1
setup_grace_s = 60
stall_after_s = 60
lost_after_s = 60

[[candidates]]
cloud = "runpod-serverless"
gpu = "A100-80G"

[clouds.runpod-serverless]
{settings}
""")
    env = {**os.environ, "RP_TEST_KEY": "test-key"}
    state = ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen([*CLI, "run", str(batch), "--json", "--out", str(tmp_path / "out"), *state],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    assert proc.stdout is not None
    assert proc.stderr is not None
    for line in proc.stdout:
        if json.loads(line)["type"] == "JobStarted":
            break
    fake.wait_for(lambda: fake.submitted and fake.jobs[fake.submitted[0]].status == "IN_PROGRESS")
    # `actor-run ssh` (issue 29.4) on the running job: no machine of ours, so no shell, and it says why
    shell = run_cli(["ssh", "sls/3", *state, "--", "pwd"], timeout=60, cwd=tmp_path, env=env)  # refused: no exec
    assert (shell.returncode, shell.stdout) == (2, "")
    assert shell.stderr == ("actor-run: ssh: runpod-serverless: a serverless job runs as a queued request in a "
                            "RunPod worker, not on a machine of ours: there is no shell to open (its log: actor-run "
                            "logs sls/3)\n")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()
    reader = LedgerReader(tmp_path / "state" / "ledger.sqlite")
    try:
        (row,) = reader.machines()
        assert json.loads(row.handle or "{}") == {"endpoint_id": row.machine_id, "job_id": fake.submitted[0]}
    finally:
        reader.close()
    assert len(fake.live_endpoints()) == 1  # the dead controller's endpoint is still there
    gate.touch()  # the job may end now, while nobody watches: resume must still fetch its output
    resume = run_cli(["resume", "--out", str(tmp_path / "out"), *state], timeout=120, cwd=tmp_path, env=env)
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "(reattached)" in resume.stdout
    assert (tmp_path / "out" / "latest" / "sls" / "seed-3" / "out" / "f.txt").read_text() == "fin\n"
    assert len(fake.submitted) == 1  # followed, not submitted twice
    assert fake.live_endpoints() == []


def dead_owner(state_dir: Path) -> str:
    """A controller this ledger knew, gone now (its owners row closed): its short id."""
    owner = "deadbeef" + "0" * 24
    ledger = Ledger(state_dir / "ledger.sqlite", owner)
    try:
        ledger.register_owner()
        ledger.close_owner()
    finally:
        ledger.close()
    return owner[:8]


def orphan(fake: FakeRunPodServerless, owner: str, workers: int = 1) -> str:
    """An endpoint a dead controller left (its name says whose), straight on the fake's REST API."""
    name = f"ar-old-1-a0-{owner}-d{int(time.time()) + 3600}"
    body = {"name": name, "type": "QUEUE", "image": "x", "gpu": {"pools": ["ADA_24"]},
            "workers": {"min": 0, "max": workers}, "scaling": {"type": "QUEUE_DELAY", "queueDelay": 4}}
    r = httpx.post(f"{fake.url}/v2/serverless", json=body, headers={"Authorization": "Bearer test-key"})
    assert r.status_code == 201, r.text
    return name


def test_a_quota_refusal_reclaims_a_dead_owners_idle_endpoint_then_runs(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], tmp_path: Path, state_dir: Path,
) -> None:
    left = orphan(fake, dead_owner(state_dir))
    foreign = orphan(fake, "0badf00d")  # another ledger's controller: not ours to reclaim
    fake.quota_workers = 2  # the orphan holds the account's only worker
    with open_runner(sweep_on_start=False) as r:
        ended = r.submit(job(fake, tmp_path)).result(60)
    assert ended.outcome == "succeeded", ended.detail
    assert fake.count("POST", "/v2/serverless", 400) == 1  # refused once, then made
    assert fake.live_endpoints() == [foreign]
    del left


def test_cancel_sends_the_queue_cancel_before_the_endpoint_goes(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], events: Any, tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    with open_runner() as r:
        handle = r.submit(job(fake, tmp_path, command=f'echo $$ > "{pids}.tmp"; mv "{pids}.tmp" "{pids}"; sleep 600'))
        events.wait_for(lambda e: type(e).__name__ == "JobStarted")
        fake.wait_for(lambda: fake.jobs[fake.submitted[0]].status == "IN_PROGRESS" and pids.exists())
        command = psutil.Process(int(pids.read_text()))
        handle.cancel()
        ended = handle.result(30)
    assert (ended.outcome, ended.failure) == ("canceled", Code.CANCELED)
    # the worker (RunPod's SDK) heard the cancel on its stop channel and the command went with it
    fake.wait_for(lambda: fake.submitted[0] in fake.stop_delivered)
    psutil.wait_procs([command], timeout=max(0.0, fake.stop_delivered[fake.submitted[0]] + 5 - time.monotonic()))
    assert not command.is_running() or command.status() == psutil.STATUS_ZOMBIE
    # answered 200 (CANCELLED): it came while the endpoint still existed
    assert fake.queue_calls.count(("POST", "/v2/{endpoint}/cancel/{job}", 200)) == 1
    assert fake.jobs[fake.submitted[0]].status == "CANCELLED"
    assert fake.live_endpoints() == []


def test_the_sweep_deletes_a_dead_owners_endpoint_and_keeps_a_foreign_one(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], tmp_path: Path, state_dir: Path,
) -> None:
    dead = dead_owner(state_dir)
    with open_runner() as r:
        assert r.submit(job(fake, tmp_path)).result(60).outcome == "succeeded"
        left = orphan(fake, dead)
        foreign = orphan(fake, "0badf00d")
        swept = r.sweep()
    assert sorted((a.machine, a.action, a.reason) for a in swept if a.cloud == "runpod-serverless") == sorted([
        (left, "deleted", "unknown to the ledger and its owner is gone"), (foreign, "keep", "foreign owner")])
    assert fake.live_endpoints() == [foreign]


def test_inputs_past_the_payload_limit_are_an_input_error_naming_it(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], tmp_path: Path,
) -> None:
    spec = job(fake, tmp_path)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(INLINE_LIMIT + 1024))
    spec = msgspec.structs.replace(spec, inputs={**spec.inputs, "big": str(big)})
    with open_runner() as r:
        ended = r.submit(spec).result(60)
    assert (ended.outcome, ended.failure) == ("failed", Code.INPUT)
    assert f"over the {INLINE_LIMIT}" in ended.detail
    assert "big " in ended.detail
    assert fake.submitted == []
    assert fake.live_endpoints() == []


def test_a_running_job_silent_past_the_stall_window_is_stalled(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], tmp_path: Path,
) -> None:
    spec = job(fake, tmp_path, command='echo "{\\"stage\\": \\"train\\"}" >> "$ACTOR_RUN_PROGRESS"; sleep 30')
    spec = msgspec.structs.replace(spec, policy=msgspec.structs.replace(FAST, stall_after_s=1.0, max_attempts=1))
    with open_runner() as r:
        ended = r.submit(spec).result(60)
    assert (ended.outcome, ended.failure) == ("failed", Code.STALLED)
    assert "no progress" in ended.detail
    assert fake.jobs[fake.submitted[0]].status == "CANCELLED"  # the queue job went with the attempt
    assert fake.live_endpoints() == []


def test_a_quota_spent_on_one_account_walks_to_the_next(
    fake: FakeRunPodServerless, open_runner: Callable[..., Any], events: Any, tmp_path: Path,
) -> None:
    other = FakeRunPodServerless(tmp_path / "fake-b").start()  # team-b's account: a quota of its own
    try:
        fake.quota_workers = 0  # the main account can hold no worker at all
        spec = job(fake, tmp_path)
        settings = {**spec.clouds["runpod-serverless"],
                    "accounts": {"team-b": {"rest_url": other.url, "queue_url": other.queue_url}}}
        spec = msgspec.structs.replace(
            spec, clouds={"runpod-serverless": settings},
            candidates=[CandidateSpec(cloud="runpod-serverless", gpu="A100-80G", accounts=["main", "team-b"])])
        with open_runner() as r:
            ended = r.submit(spec).result(60)
        assert ended.outcome == "succeeded", ended.detail
        assert fake.count("POST", "/v2/serverless", 400) == 2  # refused, nothing to reclaim, refused again
        assert fake.submitted == []
        assert len(other.submitted) == 1
        refused, ran = events.of(AttemptEnded)
        assert (refused.failure, refused.offer.account) == (Code.QUOTA, "main")
        assert (ran.outcome, ran.offer.account) == ("succeeded", "team-b")
        assert other.live_endpoints() == []
    finally:
        other.stop()
    assert other.violations == []
