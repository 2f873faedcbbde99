"""The exceptions' tree (protocols/failures.py): every exception class there is an ActorRunError
and is drawn in the module's docstring; the reactor's refusals are ActorRunErrors too."""

from __future__ import annotations

import inspect

import pytest

from actor_run.actors import Reactor
from actor_run.protocols import failures
from actor_run.protocols.failures import ActorRunError, ReactorError


def test_every_exception_is_an_actor_run_error_and_drawn_in_the_tree() -> None:
    doc = failures.__doc__ or ""
    classes = [c for _, c in inspect.getmembers(failures, inspect.isclass)
               if issubclass(c, BaseException) and c.__module__ == failures.__name__]
    assert len(classes) >= 10
    for c in classes:
        assert issubclass(c, ActorRunError), c
        assert f" {c.__name__} " in doc, f"{c.__name__} is not drawn in the tree"


def test_the_reactors_refusals_are_actor_run_errors() -> None:
    reactor = Reactor(name="reactor-refusing").start()
    try:
        with pytest.raises(ReactorError, match="started already"):
            reactor.start()
    finally:
        reactor.stop()
    assert issubclass(ReactorError, ActorRunError)
