"""Fixtures for the supervisors' tests and the scenario tests (each folder's conftest.py takes them):
a fast policy, an event recorder, Runners whose state, ledger and outputs live under tmp_path, and
the sim cloud's settings and folder."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actor_run.protocols.clouds.sim import SimGpu, SimRegion
from actor_run.protocols.messages import Event
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger import LedgerReader, MachineRow

FAST = PolicySpec(
    poll_s=0.1,
    backoff_s=0.01,
    backoff_max_s=0.05,
    setup_grace_s=20,
    stall_after_s=20,
    lost_after_s=20,
    max_attempts=3,
    deadline_margin_s=60,
    last_grace_factor=1.0,
)

# the sim without waiting: a launch and a delete take (almost) no time
SIM_FAST: dict[str, Any] = {"launch_latency_s": 0.01, "delete_latency_s": 0.0}


def policy(**kw: Any) -> PolicySpec:
    return msgspec.structs.replace(FAST, **kw)


def sim_settings(**kw: Any) -> dict[str, Any]:
    return {**SIM_FAST, **kw}


def regions(*places: tuple[str, str, int, float]) -> list[dict[str, Any]]:
    """Sim regions as a settings dict wants them: (region, gpu, stock, hourly_usd) each."""
    out: dict[str, dict[str, Any]] = {}
    for region, gpu, stock, usd in places:
        out.setdefault(region, {})[gpu] = msgspec.to_builtins(SimGpu(stock=stock, hourly_usd=usd))
    return [msgspec.to_builtins(SimRegion(name=r, gpus=g)) for r, g in out.items()]  # type: ignore[arg-type]


def sim_job(
    name: str,
    command: str,
    *,
    seed: int = 1,
    sim: dict[str, Any] | None = None,
    candidates: list[CandidateSpec] | None = None,
    **policy_kw: Any,
) -> Job:
    return Job(
        name=name,
        command=command,
        seed=seed,
        policy=policy(**policy_kw),
        candidates=candidates or [CandidateSpec(cloud="sim", gpu="A100")],
        clouds={"sim": sim_settings(**(sim or {}))},
    )


def local_job(name: str, command: str, *, seed: int = 1, **policy_kw: Any) -> Job:
    return Job(name=name, command=command, seed=seed, policy=policy(**policy_kw))


class Events:
    """Every event a Runner emits kept in order; `wait_for` blocks on the
    queue the Runner feeds, never on a timer of its own."""

    def __init__(self) -> None:
        self.q: queue.Queue[Event] = queue.Queue()
        self.seen: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.q.put(event)

    def drain(self) -> list[Event]:
        while True:
            try:
                self.seen.append(self.q.get_nowait())
            except queue.Empty:
                return self.seen

    def wait_for(self, pred: Callable[[Event], bool], timeout: float = 30.0) -> Event:
        for e in self.seen:
            if pred(e):
                return e
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no matching event within {timeout} s; saw {[type(e).__name__ for e in self.seen]}"
                )
            try:
                e = self.q.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(e)
            if pred(e):
                return e

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.drain() if isinstance(e, cls)]


@pytest.fixture
def events() -> Events:
    return Events()


# builders, as fixtures: test modules cannot import this conftest by name (tests/ has no packages)


@pytest.fixture(name="policy")
def policy_fixture() -> Callable[..., PolicySpec]:
    return policy


@pytest.fixture(name="sim_job")
def sim_job_fixture() -> Callable[..., Job]:
    return sim_job


@pytest.fixture(name="local_job")
def local_job_fixture() -> Callable[..., Job]:
    return local_job


@pytest.fixture(name="regions")
def regions_fixture() -> Callable[..., list[dict[str, Any]]]:
    return regions


@pytest.fixture(name="ledger_machines")
def ledger_machines_fixture(state_dir: Path) -> Callable[[], list[MachineRow]]:
    return lambda: ledger_machines(state_dir)


@pytest.fixture
def sim_dir(state_dir: Path) -> Path:
    """Where the sim cloud of a Runner with state_dir=state_dir keeps its state."""
    return (state_dir / "sim").resolve()


@pytest.fixture
def open_runner(tmp_path: Path, state_dir: Path, events: Events) -> Callable[..., Any]:
    """`with open_runner(**kw) as r:` a Runner whose state, ledger and outputs are under tmp_path,
    subscribed to `events`."""

    @contextmanager
    def make(**kw: Any) -> Iterator[Runner]:
        kw.setdefault("out_dir", tmp_path / "out")
        kw.setdefault("state_dir", state_dir)
        kw.setdefault("delete_timeout_s", 30.0)
        with Runner(**kw) as r:
            r.subscribe(events)
            yield r

    return make


def ledger_machines(state_dir: Path) -> list[MachineRow]:
    reader = LedgerReader(state_dir / "ledger.sqlite")
    try:
        return reader.machines()
    finally:
        reader.close()
