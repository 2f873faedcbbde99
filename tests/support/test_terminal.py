"""support/terminal.py and support/process_kit.py's Output: a child on a pty and a child's pipe,
read by a thread of the test's own, waited on with a bound."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.process_kit import Output
from support.terminal import Terminal

ASKS = "import sys; print('question? [y/N] ', end='', flush=True); a = sys.stdin.readline(); " \
       "print('on a tty:', sys.stdout.isatty(), 'answered', a.strip()); sys.exit(3)"


def test_a_child_on_a_terminal_is_read_typed_to_and_waited_on() -> None:
    with Terminal([sys.executable, "-c", ASKS], env=dict(os.environ)) as term:
        term.wait_for("[y/N]", 60)
        term.write(b"n\n")
        assert term.wait(60) == 3
    assert "on a tty: True answered n" in term.text()


def test_a_wait_for_what_never_comes_fails_saying_what_came() -> None:
    with Terminal([sys.executable, "-c", "print('something else')"], env=dict(os.environ), stdin=False) as term:
        with pytest.raises(AssertionError, match="something else"):
            term.wait_for("never said", 1.0)
        assert term.wait(60) == 0


def test_output_waits_on_a_line_and_keeps_all_said() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "print('one'); print('two')"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    out = Output(proc.stdout)
    out.wait_for("two", 60)
    with pytest.raises(AssertionError, match="one"):
        out.wait_for("three", 0.5)
    assert proc.wait(60) == 0
    assert out.rest() == "one\ntwo\n"
    proc.stdout.close()
