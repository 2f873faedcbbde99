"""Checkpoint handoff between attempts, thrashing, and resume of jobs that never started."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest

from actor_run.protocols.clouds.sim import preempt_machine, sim_machines
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import CheckpointSaved, Event, Leased
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger import Ledger, LedgerReader

# attempt 0 writes a checkpoint, says so, and waits to be preempted; attempt 1 must start from it
RESUMABLE = r'''
import json, os, time
out, progress = os.environ["ACTOR_RUN_OUT"], open(os.environ["ACTOR_RUN_PROGRESS"], "a")
resume = os.environ.get("ACTOR_RUN_RESUME")
if resume is None:
    os.makedirs(os.path.join(out, "ckpt-1200"))
    open(os.path.join(out, "ckpt-1200", "weights.bin"), "w").write("step=1200")
    progress.write(json.dumps({"stage": "train", "step": 1200, "checkpoint": "out/ckpt-1200"}) + "\n")
    progress.flush()
    time.sleep(60)  # the job's own work: it runs until preempted
else:
    line = json.load(open(resume))
    weights = open(os.path.join(os.environ["ACTOR_RUN_IN"], "resume", "ckpt-1200", "weights.bin")).read()
    open(os.path.join(out, "resumed.txt"), "w").write(f"{line['step']} {weights}")
'''


def sim_job(tmp: Path, command: str, code: Path | None, **policy: float) -> Job:
    return Job(
        name="ckpt", command=command, seed=1, code=str(code) if code else None, timeout_s=120,
        policy=PolicySpec(poll_s=0.1, setup_grace_s=30, stall_after_s=30, backoff_s=0.01, **policy),  # type: ignore[arg-type]
        candidates=[CandidateSpec(cloud="sim", gpu="A100")],
        clouds={"sim": {"launch_latency_s": 0.01, "delete_latency_s": 0.0, "state_dir": str(tmp / "sim")}},
    )


def test_a_preempted_job_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(RESUMABLE)
    events: queue.Queue[Event] = queue.Queue()
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state") as runner:
        runner.subscribe(events.put)
        handle = runner.submit(sim_job(tmp_path, "python3 job.py", code))
        machine = None
        while True:
            e = events.get(timeout=30)
            if isinstance(e, Leased) and e.attempt == 0:
                machine = e.machine.name
            if isinstance(e, CheckpointSaved):
                break
        assert machine is not None
        assert preempt_machine(tmp_path / "sim", machine)
        ended = handle.result(timeout=60)
    assert ended.outcome == "succeeded", ended
    assert ended.attempts == 2
    assert (tmp_path / "out" / "latest" / "ckpt" / "seed-1" / "out" / "resumed.txt").read_text() == "1200 step=1200"
    assert not (tmp_path / "out" / "latest" / "ckpt" / "seed-1" / ".checkpoint").exists()  # asked for: it goes
    assert sim_machines(tmp_path / "sim") == []


def test_attempts_failing_fast_stop_with_thrashing(tmp_path: Path) -> None:
    # every machine is preempted at boot: more than 2 failures within the window is thrashing
    job = sim_job(tmp_path, "sleep 30", None, max_attempts=10, thrash_max=2, thrash_window_s=60)
    job = Job(**{**{f: getattr(job, f) for f in job.__struct_fields__},
                 "clouds": {"sim": {**job.clouds["sim"], "preempt_rate": 1.0, "preempt_within_s": 0.0}}})
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state") as runner:
        ended = runner.submit(job).result(timeout=60)
    assert ended.outcome == "failed"
    assert ended.failure == Code.THRASHING
    assert ended.attempts == 3
    assert sim_machines(tmp_path / "sim") == []


def test_resume_starts_jobs_that_never_started(tmp_path: Path) -> None:
    # a dead controller's ledger: one job submitted, never started (its owner row names no live process)
    ledger_path = tmp_path / "state" / "ledger.sqlite"
    dead = Ledger(ledger_path, "d" * 32)
    job = Job(name="never", command="echo ran > $ACTOR_RUN_OUT/ran.txt", seed=7,
              policy=PolicySpec(poll_s=0.1))
    import msgspec

    dead.record_job(key=job.key, name=job.name, seed=job.seed, spec=msgspec.json.encode(job), state="running",
                    out_dir="")
    dead.close()  # no owner row at all: nobody alive owns it
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state", sweep_on_start=False) as runner:
        handles = runner.resume()
        assert [h.key for h in handles] == ["never/seed-7"]
        assert handles[0].result(timeout=60).outcome == "succeeded"
        assert runner.resume() == []  # nothing left to take
    # a job its run gave no folder (an old ledger): under out_dir, as then
    assert (tmp_path / "out" / "never" / "seed-7" / "out" / "ran.txt").read_text().strip() == "ran"
    reader = LedgerReader(ledger_path)
    try:
        assert [j["state"] for j in reader.jobs()] == ["succeeded"]
    finally:
        reader.close()


def test_secret_env_stays_out_of_the_ledger_and_comes_back_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(name="secret", command="echo \"$HF_TOKEN $PLAIN\" > $ACTOR_RUN_OUT/env.txt", seed=1,
              env={"HF_TOKEN": "hf_supersecret", "PLAIN": "visible"}, public_env=["PLAIN"],
              policy=PolicySpec(poll_s=0.1))
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state") as runner:
        assert runner.submit(job).result(timeout=60).outcome == "succeeded"
    ledger_file = tmp_path / "state" / "ledger.sqlite"
    raw = b"".join(p.read_bytes() for p in ledger_file.parent.glob("ledger.sqlite*"))
    assert b"hf_supersecret" not in raw
    assert (tmp_path / "out" / "latest" / "secret" / "seed-1" / "out" / "env.txt").read_text().strip() == (
        "hf_supersecret visible")
    # a resumer gets the secret back from its own environment
    reader = LedgerReader(ledger_file)
    try:
        import msgspec

        from actor_run.protocols.specs import unredacted

        stored = msgspec.json.decode(reader.jobs()[0]["spec"], type=Job)
    finally:
        reader.close()
    assert stored.env == {"HF_TOKEN": "<redacted>", "PLAIN": "visible"}
    monkeypatch.setenv("HF_TOKEN", "from-env")
    import os

    back, missing = unredacted(stored, dict(os.environ))
    assert back.env["HF_TOKEN"] == "from-env"
    assert missing == []


def test_resume_of_a_job_whose_secret_is_not_in_this_environment_ends_it_input_without_renting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from actor_run.protocols.specs import redacted

    monkeypatch.delenv("DEPLOY_TOKEN", raising=False)
    ledger_path = tmp_path / "state" / "ledger.sqlite"
    dead = Ledger(ledger_path, "d" * 32)
    job = Job(name="needs", command="echo \"$DEPLOY_TOKEN\" > $ACTOR_RUN_OUT/t.txt", seed=3,
              env={"DEPLOY_TOKEN": "dt_0123456789"}, policy=PolicySpec(poll_s=0.1))
    dead.record_job(key=job.key, name=job.name, seed=job.seed, spec=msgspec.json.encode(redacted(job)),
                    state="running", out_dir="")
    dead.close()
    with Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state", sweep_on_start=False) as runner:
        [handle] = runner.resume()
        ended = handle.result(timeout=60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("failed", "input", 0)
    assert "DEPLOY_TOKEN" in ended.detail
    assert not (tmp_path / "out" / "needs").exists()  # nothing ran, nothing was fetched
    reader = LedgerReader(ledger_path)
    try:
        assert [(j["state"], j["failure"]) for j in reader.jobs()] == [("failed", "input")]
        assert reader.machines() == []  # nothing was rented
    finally:
        reader.close()
