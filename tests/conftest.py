"""Shared fixtures. Every test is checked for leaks: no actor, no thread, no process and no machine
may outlive it (the autouse `no_leaks` fixture fails the test otherwise)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from hypothesis import settings

# hypothesis's deadline (200 ms an example) is a wall-clock bound: on a loaded 2-core machine one
# example of a quick property took 457 ms and failed the run. The properties hold at any speed.
settings.register_profile("actor-run", deadline=None)
settings.load_profile("actor-run")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# no test reads the user's own settings (supervisors/api/config.py): the default config file is looked
# for in an empty folder, and no ACTOR_RUN_CONFIG is inherited (tests that want one set it)
os.environ.pop("ACTOR_RUN_CONFIG", None)
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="actor-run-test-config-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], True)

from support import procs, schedule  # noqa: E402  (tests/ is on the path only from here)
from support.pg import Postgres  # noqa: E402  (tests/ is on the path only from here)
from support.sshd import Sshd  # noqa: E402  (tests/ is on the path only from here)
from support.waits import settled  # noqa: E402  (tests/ is on the path only from here)

from actor_run.actors import Reactor  # noqa: E402  (the project's root is on the path only from here)
from actor_run.actors.pool import live_actors  # noqa: E402


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected: the order of what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist every worker collects the same list and reorders it the same way
    (tests/support/schedule.py): the long tests first in each worker's share, the tests of a costly session
    fixture (moto, SkyPilot's own interpreter) in a few shares."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    names, durations = [i.nodeid for i in items], schedule.load()
    groups = schedule.groups([set(getattr(i, "fixturenames", ())) for i in items], names, durations)
    items[:] = schedule.order(items, names, durations, workers, groups)


def _machines(state_dir: Path) -> list[str]:
    found = [p.name for p in (state_dir / "local").glob("*.json")] if (state_dir / "local").is_dir() else []
    sim = state_dir / "sim" / "machines"
    if sim.is_dir():
        found += [p.name for p in sim.glob("*.json")]
    return found


def _processes_under(path: Path) -> list[str]:
    """The live processes whose command line names `path` (tests/support/procs.py reads /proc directly:
    this runs after every test, over every process of the machine)."""
    out = []
    for pid, cmd in procs.under(path):
        with contextlib.suppress(OSError):  # gone since: not left running
            if not procs.zombie(pid):  # a zombie's cmdline is empty anyway
                line = cmd.replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{pid}: {line[:160]}")
    return out


def _wait_until(check, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    return settled(check, timeout)


def _is_trio_worker(t: threading.Thread) -> bool:
    # trio keeps idle to_thread workers for 10 s after use (a test's own trio.to_thread calls); ours
    # (actor-run-pool-*, actor-run-io-*, a reactor's asyncio loop) end when the last reactor stops
    return t.name.startswith(("Trio thread", "Trio worker"))


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real OpenSSH sshd on 127.0.0.1 (tests/support/sshd.py), always stopped afterwards."""
    server = Sshd(tmp_path / "sshd")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A real PostgreSQL server (tests/support/pg.py), one for the session, stopped and removed afterwards."""
    server = Postgres()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto() -> Iterator[Any]:
    """moto's server on loopback (tests/fakes/moto_server.py), one for the session, started when a test
    first asks for it; each test's MotoEc2 or MotoS3 resets it."""
    from fakes.moto_server import MotoServer

    server = MotoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def runpod_zygote() -> Any:
    """This test process's zygote (tests/fakes/zygote.py), started: the fake RunPod serverless forks
    its workers from it. Its tests are dealt to one worker (tests/support/schedule.py), which pays for its
    imports once."""
    from fakes.zygote import zygote

    z = zygote()
    z.start()
    return z


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | Path]:
    """A fresh ledger of each backend: an SQLite file under tmp_path, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield tmp_path / "state" / "ledger.sqlite"
        return
    from actor_run.supervisors.ledger.db import close_pools

    yield request.getfixturevalue("postgres").create_database()
    close_pools()  # the read pool's threads are this test's


@pytest.fixture
def reactor() -> Iterator[Reactor]:
    """A running reactor (actors/runtime.py), stopped afterwards."""
    r = Reactor(name="test-reactor").start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    # ours (actors/pool.py: not in pykka's registry, the host's) and any pykka actor a test started
    actors = _wait_until(lambda: [*live_actors(), *pykka.ActorRegistry.get_all()], 10)
    if actors:
        for ref in reversed(actors):
            ref.stop(block=True, timeout=30)
        pytest.fail(f"actors left running: {[a.actor_class.__name__ for a in actors][:10]}")
    threads = _wait_until(
        lambda: [t.name for t in threading.enumerate()
                 if t.ident not in before and t.is_alive() and not _is_trio_worker(t)], 10)
    if threads:
        pytest.fail(f"threads left running: {threads[:10]}")
    procs = _wait_until(lambda: _processes_under(tmp_path), 10)
    if procs:
        for line in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), 9)
        pytest.fail(f"processes left running: {procs[:5]}")
    left = _machines(tmp_path / "state")
    if left:
        pytest.fail(f"machines left behind: {left[:5]}")
