"""The bench tests run each bench as a user would, but write only into the test's temporary folders:
the bench's `--dir` and a working folder of its own (`bench_cwd`), never the repository, whose
`actor-run-out/` (a user's own runs, and its `latest`) is checked untouched after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _outputs(folder: Path) -> tuple[list[str], str | None]:
    """What an `actor-run-out` holds: its entries and where `latest` points (None: no such link)."""
    if not folder.exists():
        return [], None
    latest = folder / "latest"
    return sorted(p.name for p in folder.iterdir()), os.readlink(latest) if latest.is_symlink() else None


@pytest.fixture(autouse=True)
def repository_outputs_untouched() -> Iterator[None]:
    before = _outputs(ROOT / "actor-run-out")
    yield
    assert _outputs(ROOT / "actor-run-out") == before, "a bench wrote into the repository's actor-run-out/"


@pytest.fixture
def bench_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bench's working folder: it must stay empty (every folder of a run goes under `--dir`)."""
    cwd = tmp_path_factory.mktemp("bench-cwd")
    yield cwd
    assert sorted(p.name for p in cwd.iterdir()) == [], "the bench wrote into its working folder"
