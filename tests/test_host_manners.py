"""An embedding host's process keeps what is its own: importing every public name of actor_run and
opening, using and closing a Runner on the local cloud changes neither asyncio (policy, loop
class, its functions), nor signal handlers, nor the host's logging handlers, nor pykka's registry
(the host's own actor is its only entry, of the same type, while the Runner's actors run), writes
nothing to stderr, and leaves no thread behind (each in a fresh process: what an import does is
done once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

HOST = r"""
import asyncio, io, json, logging, signal, sys, threading
from pathlib import Path
import pykka

class HostActor(pykka.ThreadingActor):  # the host's own actor system
    pass

host_actor = HostActor.start()

# the host's own logging, set up before it imports the library
logging.basicConfig(stream=io.StringIO(), level=logging.INFO)
logging.getLogger("host.app").addHandler(logging.StreamHandler(io.StringIO()))
logging.getLogger("host.quiet").setLevel(logging.ERROR)
existing = sorted(logging.root.manager.loggerDict)

def qualname(c):
    return c.__module__ + "." + c.__qualname__

def snapshot():
    loop = asyncio.new_event_loop()
    loop_class = qualname(type(loop))
    loop.close()
    loggers = {"": logging.root, **{n: logging.getLogger(n) for n in existing}}
    return {
        "policy": qualname(type(asyncio.get_event_loop_policy())),
        "loop class": loop_class,
        "asyncio functions": [id(getattr(asyncio, f)) for f in (
            "run", "new_event_loop", "get_event_loop", "get_running_loop", "set_event_loop_policy", "sleep")],
        "signals": {s: repr(signal.getsignal(getattr(signal, s))) for s in ("SIGINT", "SIGTERM", "SIGHUP")},
        "logging": {n: [repr(h) for h in lg.handlers] + [lg.level, lg.propagate, lg.disabled]
                    for n, lg in loggers.items() if isinstance(lg, logging.Logger)},
        "root level": logging.root.level,
        "pykka registry": registry(),
    }

def registry():
    return [type(pykka.ActorRegistry._actor_refs).__name__,
            [r.actor_class.__name__ for r in pykka.ActorRegistry.get_all()]]

def ours():
    return sorted(t.name for t in threading.enumerate() if t.ident not in threads_before)

threads_before = {t.ident for t in threading.enumerate()}
before = snapshot()
import actor_run
for name in actor_run.__all__:
    getattr(actor_run, name)
after_import = snapshot()

out = Path(sys.argv[1])
cycles = []
for cycle in (1, 2):
    with actor_run.Runner(out_dir=out / "out", state_dir=out / "state", sweep_on_start=False) as runner:
        ended = runner.submit(actor_run.Job(name="manners", seed=cycle, command="true")).result(120)
        assert ended.outcome == "succeeded", ended
        during = ours()
        cycles.append({"during": during, "pykka registry": registry()})
    cycles[-1]["after close"] = ours()
after_runner = snapshot()
host_actor.stop()
print(json.dumps({"before": before, "after import": after_import, "after runner": after_runner, "threads": cycles}))
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the host process saw (HOST), and its stderr."""
    tmp = tmp_path_factory.mktemp("host")
    done = subprocess.run([sys.executable, "-c", HOST, str(tmp)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    seen["stderr"] = done.stderr
    return seen


def test_importing_and_running_changes_nothing_of_the_hosts(host: dict[str, Any]) -> None:
    before = host["before"]
    for when in ("after import", "after runner"):
        for what, value in before.items():
            assert host[when][what] == value, f"{what} changed {when}: {value} -> {host[when][what]}"


def test_a_runner_whose_host_set_up_no_logging_prints_nothing(host: dict[str, Any]) -> None:
    assert host["stderr"] == "", host["stderr"][-2000:]


def test_no_thread_of_ours_outlives_close_in_either_cycle(host: dict[str, Any]) -> None:
    for cycle in host["threads"]:
        assert cycle["during"], cycle  # while open it had some: the check below can fail
        assert cycle["after close"] == [], cycle


def test_the_hosts_pykka_registry_holds_only_its_own_actors_while_a_runner_runs(host: dict[str, Any]) -> None:
    """A Runner's actors are not in pykka's registry, the host's: its `ActorRegistry.stop_all()` (a
    pykka program's shutdown) cannot stop them mid-attempt, leaving machines behind."""
    for cycle in host["threads"]:
        assert cycle["pykka registry"] == ["list", ["HostActor"]], cycle


def test_a_hosts_stdlib_handler_receives_actor_runs_warning_with_its_job(tmp_path: Path) -> None:
    """A job's first candidate names an ssh host the settings do not have: its job supervisor warns
    that the candidate's offers failed and walks on to the local cloud (supervisors/tree/job.py); the
    record reaches the handler the host put on `actor_run`, with the job as its field."""
    import logging

    import actor_run

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    tree = logging.getLogger("actor_run")
    handler = Keep(level=logging.WARNING)
    tree.addHandler(handler)
    try:
        job = actor_run.Job(
            name="warns", seed=3, command="true", timeout_s=120, policy=actor_run.Policy(max_attempts=1),
            candidates=[actor_run.Candidate(cloud="ssh", hosts=["not-configured"]), actor_run.Candidate(cloud="local")],
            clouds={"ssh": {"hosts": {"box": {"address": "127.0.0.1"}}}})
        with actor_run.Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state", sweep_on_start=False) as runner:
            assert runner.submit(job).result(120).outcome == "succeeded"
    finally:
        tree.removeHandler(handler)
    warned = [r for r in records if "offers for candidate 0 failed" in r.getMessage()]
    assert warned, [r.getMessage() for r in records]
    record = warned[0]
    assert record.levelno == logging.WARNING
    assert record.name == "actor_run.supervisors.tree.job"
    assert record.job == "warns/seed-3"  # type: ignore[attr-defined]
    assert "unknown host 'not-configured'" in record.getMessage()
