"""Whole batches on rented clouds (a fake provider per vendor on loopback, held to the vendor's
OpenAPI document, machines that are real sshd logins): offers, lease, upload, run, heartbeat,
fetch, delete, through a real `actor-run` process; the faults that reach the batch; kill -9,
resume and sweep."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.batch_kit import cli, events, kill9, read_until, start_run, write_batch
from fakes.providers import FAKES, serve


@pytest.fixture(params=sorted(FAKES))
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each vendor's fake: what every adapter must prove through a whole batch."""
    yield from serve(request.param, tmp_path)


@pytest.fixture(params=["runpod"])
def one_provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """One vendor's fake, for batch-level proofs of the shared path (each adapter's own answer to
    the same fault is proven in tests/protocols/clouds/test_rented.py)."""
    yield from serve(request.param, tmp_path)


def run(tmp: Path, fake: Any, *, seeds: list[int], **kw: Any) -> Any:
    batch = write_batch(tmp, fake.CLOUD, fake.url, gpus=list(fake.GPUS), seeds=seeds, settings=fake.settings(), **kw)
    return cli(tmp, "run", str(batch), "--json", "--out", str(tmp / "out"), key_var=fake.KEY_VAR), batch


def test_a_batch_runs_end_to_end_and_leaves_nothing(tmp_path: Path, provider: Any) -> None:
    provider.no_stock(provider.GPUS[0])
    done, _ = run(tmp_path, provider, seeds=[1, 2])
    assert done.returncode == 0, done.stderr
    for seed in (1, 2):
        assert (tmp_path / "out" / "latest" / "rented" / f"seed-{seed}" / "out" / "result.txt").read_text() == (
            f"{seed} payload")
    evs = events(done.stdout)
    assert [e["outcome"] for e in evs if e["type"] == "AttemptEnded"] == ["succeeded"] * 2
    assert provider.alive() == []
    assert len(provider.billed) == 2
    assert "test-key" not in done.stdout + done.stderr
    ledger = (tmp_path / "state" / "ledger.sqlite").read_bytes()
    assert b"test-key" not in ledger


def test_a_create_answered_500_that_made_a_machine_leaves_no_phantom(tmp_path: Path, one_provider: Any) -> None:
    provider = one_provider
    provider.create_500_made = 1
    provider.lag_reads = 2
    done, _ = run(tmp_path, provider, seeds=[1])
    assert done.returncode == 0, done.stderr
    evs = events(done.stdout)
    ended = [(e["outcome"], e.get("failure")) for e in evs if e["type"] == "AttemptEnded"]
    assert ended == [("failed", "ambiguous_create"), ("succeeded", None)]
    assert provider.alive() == []
    assert len(provider.billed) == 2  # the adopted one too, deleted


def test_a_refused_key_stops_the_batch_with_guard(tmp_path: Path, provider: Any) -> None:
    provider.token = "the-right-key"
    done, _ = run(tmp_path, provider, seeds=[1, 2])
    assert done.returncode == 1
    evs = events(done.stdout)
    assert {e.get("failure") for e in evs if e["type"] == "JobEnded"} == {"guard"}
    assert [e for e in evs if e["type"] == "LeaseRequested"] == []
    assert provider.alive() == []


def test_a_machine_that_vanishes_mid_run_is_preempted_and_retried(tmp_path: Path, one_provider: Any) -> None:
    provider = one_provider
    batch = write_batch(tmp_path, provider.CLOUD, provider.url, gpus=list(provider.GPUS), seeds=[1], first_steps=100,
                        settings=provider.settings())
    proc = start_run(tmp_path, batch, key_var=provider.KEY_VAR)
    try:
        seen = read_until(proc, "Progress")
        leased = [e for e in seen if e["type"] == "Leased"][-1]
        provider.vanish(leased["machine"]["id"])
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill9(proc)
    assert proc.returncode == 0, err
    ended = [(e["outcome"], e.get("failure")) for e in events(out) if e["type"] == "AttemptEnded"]
    assert ended == [("failed", "preempted"), ("succeeded", None)]
    assert provider.alive() == []


def test_kill_9_then_resume_then_sweep_leaves_no_machine(tmp_path: Path, provider: Any) -> None:
    gate = tmp_path / "gate"  # the jobs wait for it after their first step: none ends before the kill
    batch = write_batch(tmp_path, provider.CLOUD, provider.url, gpus=list(provider.GPUS), seeds=[1, 2], steps=4,
                        settings=provider.settings(), gate=gate)
    proc = start_run(tmp_path, batch, key_var=provider.KEY_VAR)
    read_until(proc, "Progress")
    kill9(proc)
    assert provider.alive(), "the killed controller left machines (as at the real provider)"
    gate.touch()
    resumed = cli(tmp_path, "resume", "--out", str(tmp_path / "out"), key_var=provider.KEY_VAR)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    swept = cli(tmp_path, "sweep", key_var=provider.KEY_VAR)
    assert swept.returncode == 0, swept.stderr
    assert provider.alive() == []
    for seed in (1, 2):
        assert (tmp_path / "out" / "latest" / "rented" / f"seed-{seed}" / "out" / "result.txt").is_file()


def test_a_missing_key_stops_the_run_before_anything_starts(tmp_path: Path, one_provider: Any) -> None:
    batch = write_batch(tmp_path, one_provider.CLOUD, one_provider.url, gpus=list(one_provider.GPUS), seeds=[1],
                        settings=one_provider.settings())
    done = cli(tmp_path, "run", str(batch), "--json", key_var="SOMETHING_ELSE")
    assert done.returncode == 2
    assert one_provider.KEY_VAR in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert one_provider.calls == []
