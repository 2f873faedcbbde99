"""Every fake provider, by cloud name, for tests parametrized over them."""

from __future__ import annotations

from typing import Any

from fakes.hyperstack import FakeHyperstack
from fakes.lambdacloud import FakeLambda
from fakes.runpod import FakeRunPod

FAKES: dict[str, Any] = {"hyperstack": FakeHyperstack, "lambda": FakeLambda, "runpod": FakeRunPod}
