"""actors/base.py: how an actor's failure is written down."""

from __future__ import annotations

import sys

from loguru import logger

from actor_run.actors.base import failure_text


def _fail_holding_a_secret() -> None:
    env = {"API_KEY": "s3cr3t-value"}
    raise ValueError("bad input: " + str(len(env)) + " variables")


def test_a_failure_is_written_without_the_values_of_local_variables() -> None:
    try:
        _fail_holding_a_secret()
    except ValueError:
        exc_info = sys.exc_info()
    # the control: loguru's diagnose (on in its default handler) prints locals, the secret with them
    lines: list[str] = []
    sink = logger.add(lines.append, diagnose=True, backtrace=True)
    try:
        logger.opt(exception=exc_info).error("failed")
    finally:
        logger.remove(sink)
    assert "s3cr3t-value" in "".join(lines)
    # ours: the traceback (where and what), never the values
    text = failure_text(*exc_info)
    assert "_fail_holding_a_secret" in text
    assert "ValueError: bad input: 1 variables" in text
    assert "s3cr3t-value" not in text
