"""The public API: what `actor_run` exports, the examples that embed it (run, and checked by
`mypy --strict`), and `JobHandle.wait_async` inside asyncio and trio loops that keep running."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import trio

import actor_run
from actor_run import Job, JobEnded, Policy, Runner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_is_there_sorted_and_says_what_it_promises() -> None:
    names = actor_run.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    for name in names:
        value = getattr(actor_run, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("actor_run."), name
            assert (value.__doc__ or "").strip(), f"{name} has no docstring"
    assert actor_run.Policy is actor_run.protocols.specs.PolicySpec
    assert actor_run.Candidate is actor_run.protocols.specs.CandidateSpec
    assert {"Runner", "Job", "Batch", "Candidate", "Policy", "Code", "JobEnded", "Event", "JobHandle"} <= set(names)
    # every event struct the CLI's --json can print is public
    events = {t.__name__ for t in actor_run.protocols.messages.EVENTS.__args__}
    assert events <= set(names)


def test_the_public_names_load_on_first_use(tmp_path: Path) -> None:
    """`import actor_run` (which every `actor-run` process does) loads none of the tree: each public
    name is imported when first used (PEP 562), is the object its module defines, and is listed by
    dir(); a name it does not export is an AttributeError. So for the ledger's and the views' packages."""
    script = """
import sys
import actor_run
import actor_run.supervisors.ledger as ledger
import actor_run.supervisors.views as views
heavy = {"trio", "pykka", "actor_run.supervisors.api.runner", "actor_run.actors", "rich", "importlib.metadata"}
assert not heavy & set(sys.modules), sorted(heavy & set(sys.modules))
for package in (actor_run, ledger, views):
    assert set(package.__all__) <= set(dir(package)), package
    try:
        package.NoSuchName
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError(package)
from actor_run import Runner, __version__
from actor_run.supervisors.api.runner import Runner as Defined
assert Runner is Defined and "trio" in sys.modules
assert __version__ and __version__ == actor_run.__version__
assert ledger.LedgerReader is sys.modules["actor_run.supervisors.ledger.reader"].LedgerReader
assert views.View is sys.modules["actor_run.supervisors.views.live"].View
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_the_examples_pass_mypy_strict() -> None:
    # the project's own settings (pyproject.toml: strict): the same options as scripts/test.sh's mypy
    # run, so the two share mypy's cache (other options made each run check everything again: 5-6 s of
    # CPU each, twice a run)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "examples/embed.py", "examples/async_embed.py",
         "examples/trio_embed.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_embedding_example_runs_its_batch(tmp_path: Path) -> None:
    ended = _example("embed").run(tmp_path / "out", tmp_path / "state")
    assert [(e.seed, e.outcome) for e in ended] == [(1, "succeeded"), (2, "succeeded"), (3, "succeeded")]
    for e in ended:
        # each run keeps its results under <out>/<run>/, and <out>/latest names the newest
        assert Path(e.out_dir) == (tmp_path / "out" / "latest" / "embedded" / f"seed-{e.seed}").resolve()
        assert list((Path(e.out_dir) / "out").iterdir())


def test_the_async_example_awaits_without_blocking_its_loop(tmp_path: Path) -> None:
    ended, ticks = asyncio.run(_example("async_embed").run(tmp_path / "out", tmp_path / "state"))
    assert ended.outcome == "succeeded", ended.detail
    assert ticks >= 3  # the job waited for the loop's third tick
    assert (tmp_path / "out" / "latest" / "awaited" / "seed-1" / "out" / "note.txt").read_text() == "released\n"


def test_the_trio_example_awaits_without_blocking_its_loop(tmp_path: Path) -> None:
    ended, ticks = trio.run(_example("trio_embed").run, tmp_path / "out", tmp_path / "state")
    assert ended.outcome == "succeeded", ended.detail
    assert ticks >= 3  # the job waited for the loop's third tick
    assert (tmp_path / "out" / "latest" / "awaited" / "seed-1" / "out" / "note.txt").read_text() == "released\n"


def test_wait_async_in_trio(tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = Job(name="trio-awaited", seed=7, command=f"while [ ! -e {go} ]; do sleep 0.05; done; exit 3",
              timeout_s=120, policy=Policy(max_attempts=1, poll_s=0.2))
    runner = Runner(out_dir=tmp_path / "out", state_dir=tmp_path / "state")

    async def main() -> JobEnded:
        await trio.to_thread.run_sync(runner.open)
        try:
            handle = runner.submit(job)
            async with trio.open_nursery() as nursery:
                async def release() -> None:
                    go.touch()  # runs once the main task is parked in wait_async: the job ends only then

                nursery.start_soon(release)
                ended = await handle.wait_async()
            again = await handle.wait_async()  # an ended job answers at once
            assert again == ended
            return ended
        finally:
            await trio.to_thread.run_sync(runner.close)

    ended = trio.run(main)
    assert (ended.outcome, ended.failure) == ("failed", actor_run.Code.JOB_FAILED)  # exit 3: the job's own failure
