"""Fixtures for the actor tests (the reactor is the root conftest's): a ledger on tmp_path, a Context
built as the Runner builds it (local and sim clouds over `state_dir`), a probe actor that records
what it is told, and real machines to point the actors at (actor_kit.py has the helpers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from actor_kit import Machines, Mailbox, Probe, ProbeHandle, fast_sim, others, wait_actors_stopped

from actor_run.actors import Context, Reactor
from actor_run.protocols.clouds.local import LocalCloud, LocalSettings
from actor_run.protocols.clouds.sim import SimCloud, SimSettings
from actor_run.supervisors.ledger import Ledger, LedgerReader


@pytest.fixture
def owner() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def ledger(tmp_path: Path, owner: str) -> Iterator[Ledger]:
    led = Ledger(tmp_path / "ledger.sqlite", owner)
    try:
        yield led
    finally:
        led.close()


@pytest.fixture
def reader(ledger: Ledger) -> Iterator[LedgerReader]:
    r = LedgerReader(ledger.path)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def emitted() -> Mailbox:
    """What the actors `ctx.emit`."""
    return Mailbox()


@pytest.fixture
def probe() -> Iterator[ProbeHandle]:
    box = Mailbox()
    ref = Probe.start(box)
    try:
        yield ProbeHandle(ref, box)
    finally:
        ref.stop()


@pytest.fixture
def make_context(
    reactor: Reactor, ledger: Ledger, owner: str, state_dir: Path, tmp_path: Path, emitted: Mailbox,
) -> Iterator[Callable[..., Context]]:
    """Build a Context as supervisors/api/runner.py does; `sim=SimSettings(...)` picks the sim's fates."""

    def make(*, sim: SimSettings | None = None, meter_period_s: float = 0.2,
             delete_timeout_s: float = 10.0) -> Context:
        clouds: dict[str, Any] = {
            "local": LocalCloud(LocalSettings(), state_dir),
            "sim": SimCloud(sim or fast_sim(), state_dir),
        }
        return Context(reactor=reactor, clouds=clouds, ledger=ledger, emit=emitted.put, owner=owner,
                       out_root=tmp_path / "out", meter_period_s=meter_period_s,
                       delete_timeout_s=delete_timeout_s)

    yield make
    # An actor a test left running would hold its machine: stop it while the reactor still runs (the
    # lease deletes its machine), and fail the test. Actors that stop themselves get time to do so.
    left = wait_actors_stopped(10)
    if left:
        for ref in reversed(others()):
            ref.stop(block=True, timeout=60)
        pytest.fail(f"actors left running: {left}")


@pytest.fixture
def ctx(make_context: Callable[..., Context]) -> Context:
    return make_context()


@pytest.fixture
def machines(ctx: Context) -> Machines:
    return Machines(ctx)

