"""The supervisors' tests take the Runner fixtures of tests/support/runner_kit.py. The views' tests
drive `actor-run` with the CLI tests' helpers (cli/test_cli.py), and pytest puts a test's own folder
on sys.path only: that one too, from every folder under this one."""

from __future__ import annotations

import sys
from pathlib import Path

from support.runner_kit import *  # noqa: F403  (its fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parent / "cli"))
