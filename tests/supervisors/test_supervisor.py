"""supervisors/supervisor.py: the generic OTP supervisor, with small real pykka children.

Each child records into a shared `Recorder`: ("start", name) when it is constructed (on the
supervisor's thread, so in the order the supervisor starts them) and ("stop", name) in its
`on_stop`. A child told "crash" or "exit" stops itself and only then tells its parent
`ChildFailed` / `ChildExited`, recording ("told", name) after the tell, so a test that waited for
("told", name) knows the supervisor's inbox holds the report before anything it asks next."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actor_run.protocols.messages import ChildFailed
from actor_run.supervisors.supervisor import (
    ChildExited,
    ChildSpec,
    GaveUp,
    Restart,
    Strategy,
    Supervisor,
    restart_allowed,
    should_restart,
)

# --- restart intensity: a pure function ----------------------------------------------------------


def _replay(times: list[float], intensity: int, period_s: float) -> tuple[list[float], int | None]:
    """Feed restart times to the rule the way a supervisor does; the accepted ones and the index
    of the first refused (None if all were allowed)."""
    history: list[float] = []
    accepted: list[float] = []
    for i, now in enumerate(times):
        ok, history = restart_allowed(history, now, intensity=intensity, period_s=period_s)
        if not ok:
            return accepted, i
        accepted.append(now)
    return accepted, None


_gaps = st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1, max_size=40)


def _times(gaps: list[float]) -> list[float]:
    out, t = [], 1000.0
    for g in gaps:
        t += g
        out.append(t)
    return out


@given(
    gaps=_gaps,
    intensity=st.integers(min_value=1, max_value=6),
    period_s=st.floats(min_value=0.5, max_value=30.0, allow_nan=False),
)
def test_restart_intensity_never_allows_more_than_intensity_in_a_period(
    gaps: list[float], intensity: int, period_s: float
) -> None:
    times = _times(gaps)
    accepted, refused = _replay(times, intensity, period_s)
    # every accepted restart, with those accepted before it inside the period, is at most `intensity`
    for i, t in enumerate(accepted):
        assert sum(1 for u in accepted[: i + 1] if t - u <= period_s) <= intensity
    if refused is not None:
        # refused exactly when the restart would be one too many inside the period
        now = times[refused]
        assert sum(1 for u in accepted if now - u <= period_s) + 1 > intensity


@given(
    gaps=_gaps,
    intensity=st.integers(min_value=1, max_value=6),
    period_s=st.floats(min_value=0.5, max_value=30.0, allow_nan=False),
)
def test_restart_allowed_when_fewer_than_intensity_in_the_period(
    gaps: list[float], intensity: int, period_s: float
) -> None:
    times = _times(gaps)
    history: list[float] = []
    for now in times:
        recent = [u for u in history if now - u <= period_s]
        ok, new_history = restart_allowed(history, now, intensity=intensity, period_s=period_s)
        assert ok == (len(recent) < intensity)
        # the history kept is pruned to the period and includes this restart
        assert new_history == [*recent, now]
        if not ok:
            break
        history = new_history


def test_restart_intensity_examples() -> None:
    # 3 in 5 s: the 4th within 5 s is refused; once the first is older than 5 s, allowed again
    assert _replay([0.0, 1.0, 2.0, 3.0], 3, 5.0) == ([0.0, 1.0, 2.0], 3)
    assert _replay([0.0, 1.0, 2.0, 5.5], 3, 5.0) == ([0.0, 1.0, 2.0, 5.5], None)
    # as in OTP, a restart exactly period_s old still counts
    assert _replay([0.0, 1.0, 2.0, 5.0], 3, 5.0) == ([0.0, 1.0, 2.0], 3)
    # intensity 1: two restarts at the same moment are one too many
    assert _replay([7.0, 7.0], 1, 5.0) == ([7.0], 1)


@pytest.mark.parametrize(
    ("restart", "abnormal", "expected"),
    [
        (Restart.PERMANENT, False, True),
        (Restart.PERMANENT, True, True),
        (Restart.TRANSIENT, False, False),
        (Restart.TRANSIENT, True, True),
        (Restart.TEMPORARY, False, False),
        (Restart.TEMPORARY, True, False),
    ],
)
def test_should_restart_by_type(restart: Restart, abnormal: bool, expected: bool) -> None:
    assert should_restart(restart, abnormal=abnormal) is expected


# --- real actors ---------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []
        self.cond = threading.Condition()

    def add(self, kind: str, name: str) -> None:
        with self.cond:
            self.entries.append((kind, name))
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[list[tuple[str, str]]], bool], timeout: float = 10.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: pred(self.entries), timeout):
                raise AssertionError(f"timed out; recorded: {self.entries}")

    def count(self, kind: str, name: str) -> int:
        with self.cond:
            return self.entries.count((kind, name))

    def mark(self) -> int:
        with self.cond:
            return len(self.entries)

    def since(self, mark: int, kinds: tuple[str, ...] = ("start", "stop")) -> list[tuple[str, str]]:
        with self.cond:
            return [e for e in self.entries[mark:] if e[0] in kinds]


class Child(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(self, name: str, rec: Recorder, parent: pykka.ActorRef[Any]) -> None:
        super().__init__()
        self.name, self.rec, self.parent = name, rec, parent
        self.report: Any = None
        rec.add("start", name)  # constructed on the supervisor's thread: its start order

    def on_receive(self, message: Any) -> Any:
        match message:
            case "crash":
                self.report = ChildFailed(child=self.name, detail="boom")
                self.stop()
            case "exit":
                self.report = ChildExited(child=self.name)
                self.stop()
            case "ping":
                return self.name
        return None

    def on_stop(self) -> None:
        self.rec.add("stop", self.name)
        if self.report is not None:
            self.parent.tell(self.report)
            self.rec.add("told", self.name)


class Parent(pykka.ThreadingActor):
    """Stands for the supervisor's own parent: keeps what it is told."""

    use_daemon_thread = True

    def __init__(self) -> None:
        super().__init__()
        self.got: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        if message == "got":
            return list(self.got)
        self.got.append(message)
        return None


def spec(name: str, rec: Recorder, restart: Restart = Restart.PERMANENT) -> ChildSpec:
    return ChildSpec(name=name, start=lambda parent: Child.start(name, rec, parent), restart=restart, shutdown_s=10)


class Tree:
    """A supervisor under test, with its recorder and a fake clock the test moves."""

    def __init__(
        self,
        names: list[str],
        *,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        restart: dict[str, Restart] | None = None,
        intensity: int = 3,
        period_s: float = 5.0,
        parent: pykka.ActorRef[Any] | None = None,
    ) -> None:
        self.rec = Recorder()
        self.now = 100.0
        restart = restart or {}
        self.specs = [spec(n, self.rec, restart.get(n, Restart.PERMANENT)) for n in names]
        self.sup = Supervisor.start(
            "sup",
            self.specs,
            strategy=strategy,
            intensity=intensity,
            period_s=period_s,
            parent=parent,
            clock=lambda: self.now,
        )
        self.rec.wait_for(lambda es: sum(1 for e in es if e[0] == "start") == len(names))

    def child(self, name: str) -> pykka.ActorRef[Any]:
        children = self.sup.ask("children", timeout=10)
        assert name in children
        refs = self.sup.proxy().children.get(timeout=10)
        return refs[name]

    def children(self) -> list[str]:
        result: list[str] = self.sup.ask("children", timeout=10)
        return result

    def make_exit(self, name: str, how: str) -> None:
        """The child stops itself, then reports; returns once the supervisor has acted on the report
        (so a test may move the clock without racing the supervisor's reading of it)."""
        told = self.rec.count("told", name)
        self.child(name).tell(how)
        self.rec.wait_for(lambda es: es.count(("told", name)) > told)
        with contextlib.suppress(pykka.ActorDeadError):  # it gave up and stopped
            self.sup.ask("children", timeout=10)  # queued behind the report

    def stop(self) -> None:
        if self.sup.is_alive():
            self.sup.stop(block=True, timeout=30)


@pytest.fixture
def trees() -> Iterator[Callable[..., Tree]]:
    made: list[Tree] = []

    def make(*names: str, **kw: Any) -> Tree:
        t = Tree(list(names), **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.stop()


def test_children_start_in_spec_order_and_stop_in_reverse(trees: Callable[..., Tree]) -> None:
    t = trees("a", "b", "c", "d")
    assert t.rec.since(0) == [("start", "a"), ("start", "b"), ("start", "c"), ("start", "d")]
    assert t.children() == ["a", "b", "c", "d"]
    mark = t.rec.mark()
    t.stop()
    assert t.rec.since(mark) == [("stop", "d"), ("stop", "c"), ("stop", "b"), ("stop", "a")]
    assert not t.sup.is_alive()


@pytest.mark.parametrize(
    ("restart", "how", "restarted"),
    [
        (Restart.PERMANENT, "exit", True),
        (Restart.PERMANENT, "crash", True),
        (Restart.TRANSIENT, "exit", False),
        (Restart.TRANSIENT, "crash", True),
        (Restart.TEMPORARY, "exit", False),
        (Restart.TEMPORARY, "crash", False),
    ],
)
def test_restart_types(trees: Callable[..., Tree], restart: Restart, how: str, restarted: bool) -> None:
    t = trees("a", "b", restart={"b": restart})
    mark = t.rec.mark()
    t.make_exit("b", how)
    children = t.children()  # asked after the report: the supervisor has handled it
    if restarted:
        assert children == ["a", "b"]
        t.rec.wait_for(lambda es: es.count(("start", "b")) == 2)
        assert t.child("b").ask("ping", timeout=10) == "b"  # a new, live instance
        assert t.rec.since(mark) == [("stop", "b"), ("start", "b")]
    else:
        assert children == ["a"]
        assert t.rec.since(mark) == [("stop", "b")]
    # the supervisor's stop stops whoever is left, in reverse order; a temporary child is forgotten
    mark = t.rec.mark()
    t.stop()
    assert t.rec.since(mark) == ([("stop", "b"), ("stop", "a")] if restarted else [("stop", "a")])


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # c fails among a b c d; c has stopped itself before the supervisor hears of it
        (Strategy.ONE_FOR_ONE, [("stop", "c"), ("start", "c")]),
        (
            Strategy.ONE_FOR_ALL,
            [
                ("stop", "c"),
                ("stop", "d"),
                ("stop", "b"),
                ("stop", "a"),
                ("start", "a"),
                ("start", "b"),
                ("start", "c"),
                ("start", "d"),
            ],
        ),
        (Strategy.REST_FOR_ONE, [("stop", "c"), ("stop", "d"), ("start", "c"), ("start", "d")]),
    ],
)
def test_strategies_restart_the_right_children(
    trees: Callable[..., Tree], strategy: Strategy, expected: list[tuple[str, str]]
) -> None:
    t = trees("a", "b", "c", "d", strategy=strategy)
    before = {n: t.child(n) for n in "abcd"}
    mark = t.rec.mark()
    t.make_exit("c", "crash")
    assert sorted(t.children()) == ["a", "b", "c", "d"]
    n_starts = sum(1 for e in expected if e[0] == "start")
    t.rec.wait_for(lambda es: sum(1 for e in es[mark:] if e[0] == "start") == n_starts)
    assert t.rec.since(mark) == expected
    restarted = {e[1] for e in expected if e[0] == "start"}
    for n in "abcd":
        now = t.child(n)
        assert now.is_alive()
        assert (now.actor_urn != before[n].actor_urn) == (n in restarted)


def test_exceeding_intensity_stops_all_children_and_tells_the_parent(trees: Callable[..., Tree]) -> None:
    parent = Parent.start()
    try:
        t = trees("a", "b", "c", intensity=2, period_s=10.0, parent=parent)
        t.make_exit("b", "crash")
        t.now += 1
        t.make_exit("b", "crash")
        assert sorted(t.children()) == ["a", "b", "c"]  # two restarts in 10 s: allowed
        t.now += 1
        mark = t.rec.mark()
        t.make_exit("b", "crash")  # the third within 10 s: one too many
        assert t.sup.actor_stopped.wait(10)
        # every other child stopped, in reverse order, and none restarted
        assert t.rec.since(mark) == [("stop", "b"), ("stop", "c"), ("stop", "a")]
        got = parent.ask("got", timeout=10)
        assert len(got) == 1
        assert isinstance(got[0], GaveUp)
        assert got[0].supervisor == "sup"
        assert "more than 2 restarts" in got[0].detail
    finally:
        parent.stop()


def test_restarts_spread_beyond_the_period_do_not_give_up(trees: Callable[..., Tree]) -> None:
    parent = Parent.start()
    try:
        t = trees("a", intensity=1, period_s=5.0, parent=parent)
        for _ in range(4):
            t.make_exit("a", "crash")
            t.now += 6.0  # each restart alone in its period
        assert t.children() == ["a"]
        t.rec.wait_for(lambda es: es.count(("start", "a")) == 5)
        assert t.sup.is_alive()
        assert parent.ask("got", timeout=10) == []
    finally:
        parent.stop()


def test_normal_exits_of_permanent_children_count_toward_intensity(trees: Callable[..., Tree]) -> None:
    parent = Parent.start()
    try:
        t = trees("a", intensity=1, period_s=5.0, parent=parent)
        t.make_exit("a", "exit")
        t.make_exit("a", "exit")
        assert t.sup.actor_stopped.wait(10)
        got = parent.ask("got", timeout=10)
        assert [type(g) for g in got] == [GaveUp]
    finally:
        parent.stop()


def test_unknown_message_goes_back_to_the_asker(trees: Callable[..., Tree]) -> None:
    t = trees("a")
    with pytest.raises(TypeError, match="sup cannot handle"):
        t.sup.ask("what", timeout=10)
    assert t.sup.is_alive()
