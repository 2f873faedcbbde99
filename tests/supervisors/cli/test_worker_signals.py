"""A worker's SIGTERM and Ctrl-C handler (supervisors/cli/worker.py `_Signals`): it runs between two
bytecodes of the main thread, wherever that thread is, so it only counts; the poll loop wakes at
once and says what each signal means, once."""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from actor_run.supervisors.cli.worker import _Signals


@contextlib.contextmanager
def handling(signals: _Signals) -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, signals)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_wakes_the_wait_at_once_and_the_handler_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    signals = _Signals(mode="hand back")
    sender = threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGTERM))
    with handling(signals):
        began = time.monotonic()
        sender.start()
        signals.wait(30.0)
        waited = time.monotonic() - began
        sender.join()
    assert signals.count == 1
    assert waited < 10.0  # woken by the signal, not by the 30 s timeout
    assert err.getvalue() == ""  # nothing written from inside the handler
    assert signals.stop
    assert signals.hand_back
    signals.news()
    signals.news()  # said once
    assert err.getvalue().count("handing this worker's jobs back") == 1


def test_drain_hands_back_on_the_second_signal_and_cancel_never() -> None:
    drain, cancel = _Signals(mode="drain"), _Signals(mode="cancel")
    for s in (drain, cancel):
        s(signal.SIGTERM, None)
    assert drain.stop
    assert not drain.hand_back
    assert cancel.stop
    assert not cancel.hand_back
    drain(signal.SIGTERM, None)
    cancel(signal.SIGTERM, None)
    assert drain.hand_back
    assert not cancel.hand_back


def test_signals_that_land_anywhere_in_the_loop_are_all_counted_and_none_hangs_it() -> None:
    """Fifty SIGTERMs at random moments of a wait-and-news loop (the handler once took an Event's lock,
    which the interrupted wait could hold: a deadlock); the loop is bounded by the count it waits for."""
    signals = _Signals(mode="cancel")
    sent = 50

    def send() -> None:  # the next one once the last was counted: the kernel merges a pending signal's repeats
        for i in range(sent):
            os.kill(os.getpid(), signal.SIGTERM)
            end = time.monotonic() + 10
            while signals.count <= i and time.monotonic() < end:
                time.sleep(random.uniform(0, 0.002))  # the thing under test: signals at random moments

    sender = threading.Thread(target=send)
    with handling(signals), contextlib.redirect_stderr(io.StringIO()):
        sender.start()
        end = time.monotonic() + 60
        while signals.count < sent and time.monotonic() < end:
            signals.wait(0.001)
            signals.news()
        sender.join()
    assert signals.count == sent
    assert signals.told == sent
