"""A provider that answers 15 % of its calls with a transient 500 (issue 46 item 7): half of them
doing nothing, half doing the work and losing the answer, on the create, the listing, the reads
and the delete alike. Batch after batch, every job succeeds, no machine is left, and the run
exits 0: a transient error while proving a machine gone is asked again, not a leak."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.batch_kit import cli, events, write_batch
from fakes.providers import serve

RUNS = 10
FRACTION = 0.15


@pytest.fixture
def lambda_fake(tmp_path: Path) -> Iterator[Any]:
    yield from serve("lambda", tmp_path)


def test_ten_batches_against_15_percent_transient_500s_all_succeed_and_leave_nothing(
        tmp_path: Path, lambda_fake: Any) -> None:
    fake = lambda_fake
    for n in range(RUNS):
        fake.transient_errors(FRACTION, seed=n)  # seeded: the same faults each time the suite runs
        tmp = tmp_path / f"run-{n}"
        tmp.mkdir()
        batch = write_batch(tmp, fake.CLOUD, fake.url, gpus=list(fake.GPUS), seeds=[1, 2],
                            settings=fake.settings())
        done = cli(tmp, "run", str(batch), "--json", "--out", str(tmp / "out"), key_var=fake.KEY_VAR, timeout=300)
        ended = [(e["outcome"], e.get("failure")) for e in events(done.stdout) if e["type"] == "JobEnded"]
        assert (n, done.returncode, ended) == (n, 0, [("succeeded", None)] * 2), done.stderr[-3000:]
        assert fake.alive() == [], n
        assert "could not be confirmed deleted" not in done.stderr
        assert " WARNING " not in done.stderr  # what the batch rode out needs nothing of the user
    hit = {(method, template) for method, template, _ in fake.faults}
    kinds = {when for _, _, when in fake.faults}
    assert kinds == {"before", "after"}
    templates = {t for _, t in hit}
    assert any("launch" in t for t in templates), hit  # the create
    assert any("terminate" in t for t in templates), hit  # the delete
    assert ("GET", "/api/v1/instances") in hit, hit  # the listing
