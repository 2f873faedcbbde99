"""Scenario tests: whole batches through the Runner or the `actor-run` command, against the sim,
the fake providers, a real sshd or PostgreSQL. They take the Runner fixtures of
tests/support/runner_kit.py."""

from __future__ import annotations

from support.runner_kit import *  # noqa: F403  (its fixtures)
