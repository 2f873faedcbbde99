"""Every fake provider, by cloud name, for tests parametrized over them; `serve` starts one for a
test, `rented_cloud` makes its cloud the way a user's settings would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actor_run.protocols.clouds import make_cloud
from fakes.hyperstack import FakeHyperstack
from fakes.keys import client_key
from fakes.lambdacloud import FakeLambda
from fakes.runpod import FakeRunPod
from fakes.shadeform import FakeShadeform
from fakes.vastai import FakeVast

FAKES: dict[str, Any] = {"hyperstack": FakeHyperstack, "lambda": FakeLambda, "runpod": FakeRunPod,
                         "shadeform": FakeShadeform, "vastai": FakeVast}


def serve(name: str, tmp_path: Path, **options: Any) -> Iterator[Any]:
    """The vendor's fake (made with `options`, e.g. `virtual=True`), started under `tmp_path` for
    one test (a fixture's body: `yield from`), stopped after it, and held to the vendor's document:
    no request or answer broke it."""
    fake = FAKES[name](tmp_path / "fake", **options).start()
    try:
        yield fake
    finally:
        fake.stop()
    assert fake.violations == []


def rented_cloud(fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: object) -> Any:
    """The fake's cloud made as `[clouds.<name>]` would make it: its key in the vendor's variable, a
    client key under `tmp_path`, quick polls and short waits, the fake's own settings (how to reach
    its machines), then `extra` over all of them (`listing_lag_s=5.0`, `launch_timeout_s=0.5`)."""
    monkeypatch.setenv(fake.KEY_VAR, "test-key")
    raw = {"api_url": fake.url, "ssh_key": str(client_key(tmp_path / "keys")), "poll_s": 0.05,
           "listing_lag_s": 1.0, "delete_wait_s": 10.0, "launch_timeout_s": 60.0, **fake.settings(), **extra}
    return make_cloud(fake.CLOUD, raw, tmp_path / "state")
