"""Every fake provider, by cloud name, for tests parametrized over them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fakes.hyperstack import FakeHyperstack
from fakes.lambdacloud import FakeLambda
from fakes.runpod import FakeRunPod
from fakes.shadeform import FakeShadeform
from fakes.vastai import FakeVast

FAKES: dict[str, Any] = {"hyperstack": FakeHyperstack, "lambda": FakeLambda, "runpod": FakeRunPod,
                         "shadeform": FakeShadeform, "vastai": FakeVast}


def serve(name: str, tmp_path: Path) -> Iterator[Any]:
    """The vendor's fake, started under `tmp_path` for one test (a fixture's body: `yield from`),
    stopped after it, and held to the vendor's document: no request or answer broke it."""
    fake = FAKES[name](tmp_path / "fake").start()
    try:
        yield fake
    finally:
        fake.stop()
    assert fake.violations == []
