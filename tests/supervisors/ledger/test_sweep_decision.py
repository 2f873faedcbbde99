"""supervisors/ledger/sweep.py's decision as a pure function, over random worlds (hypothesis): what a
sweep may delete, and what it must keep."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from actor_run.protocols.hosts.workspace import HostBeat
from actor_run.protocols.messages import Machine
from actor_run.protocols.names import encode_name
from actor_run.supervisors.ledger import MachineRow
from actor_run.supervisors.ledger.sweep import MIN_BEAT_WINDOW_S, Owners, decide, decide_all

NOW = 1_800_000_000.0


class World(msgspec.Struct, frozen=True):
    listed: dict[str, list[Machine]]
    rows: list[MachineRow]
    owners: Owners
    beats: dict[str, HostBeat]
    grace_s: float
    kinds: dict[str, str]  # owner id -> alive | dead | unknown | declared
    launched_during: set[str]  # machines made after the listing (their rows are in the ledger)


def row(name: str, owner: str, deadline: float, state: str = "alive", resumable: int = 0) -> MachineRow:
    return MachineRow(name=name, cloud="sim", owner=owner, job="j", seed=1, attempt=0, deadline=deadline,
                      state=state, phase="running", machine_id=name, region="r", hourly_usd=1.0, created=NOW - 10,
                      gone=None, reason=None, detail=None, work=None, pid=None, launched_at=None, resumable=resumable)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    n_owners = draw(st.integers(1, 5))
    ids = draw(st.lists(st.text("0123456789abcdef", min_size=32, max_size=32), min_size=n_owners,
                        max_size=n_owners, unique_by=lambda s: s[:8]))
    kinds = {o: draw(st.sampled_from(["alive", "dead", "unknown", "declared"])) for o in ids}
    alive = {o for o, k in kinds.items() if k == "alive"}
    owners = Owners(alive=frozenset(alive | {o[:8] for o in alive}),
                    known=frozenset({o for o, k in kinds.items() if k != "unknown"}
                                    | {o[:8] for o, k in kinds.items() if k != "unknown"}),
                    dead=frozenset(o[:8] for o, k in kinds.items() if k == "declared"))
    listed: list[Machine] = []
    rows: list[MachineRow] = []
    beats: dict[str, HostBeat] = {}
    during: set[str] = set()
    for i in range(draw(st.integers(0, 12))):
        owner = draw(st.sampled_from(ids))
        deadline = NOW + draw(st.integers(-3000, 3000))
        name = encode_name(f"j{i}", 1, 0, owner, deadline)
        if draw(st.booleans()) and kinds[owner] == "alive":  # made while the sweep ran: not in the listing
            during.add(name)
            rows.append(row(name, owner, deadline))
            continue
        listed.append(Machine(cloud="sim", id=name, name=name, deadline=deadline))
        if kinds[owner] != "unknown" and draw(st.booleans()):
            rows.append(row(name, owner, deadline, draw(st.sampled_from(["alive", "deleted"])),
                            draw(st.sampled_from([0, 1]))))
        if draw(st.booleans()):
            beats[name] = HostBeat(age_s=draw(st.floats(0, 2000)),
                                   lost_after_s=draw(st.one_of(st.none(), st.floats(1, 1000))))
    # rows of machines the provider no longer lists, whoever owns them
    known = [o for o in ids if kinds[o] != "unknown"]
    for i in range(draw(st.integers(0, 3)) if known else 0):
        owner = draw(st.sampled_from(known))
        rows.append(row(encode_name(f"gone{i}", 1, 0, owner, NOW + 100), owner, NOW + 100))
    return World(listed={"sim": listed}, rows=rows, owners=owners, beats=beats,
                 grace_s=float(draw(st.integers(0, 1200))), kinds=kinds, launched_during=during)


def stale(beat: HostBeat | None, default_lost: float) -> bool:
    if beat is None:
        return False
    return beat.age_s > max(MIN_BEAT_WINDOW_S, beat.lost_after_s if beat.lost_after_s is not None else default_lost)


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_a_sweep_deletes_only_on_proof(w: World) -> None:
    actions, ask = decide_all(w.listed, w.rows, w.owners, now=NOW, grace_s=w.grace_s, beats=w.beats,
                              lost_after_s=120.0)
    machines = {m.name: m for m in w.listed["sim"]}
    owner_of = {m.name: next(o for o in w.kinds if o[:8] == m.name.split("-")[-2]) for m in w.listed["sim"]}
    owner_of |= {r.name: r.owner for r in w.rows}
    for a in actions:
        kind = w.kinds[owner_of[a.machine]]
        if a.machine in w.launched_during:
            assert a.action == "keep", a  # made while the sweep ran: never touched (not even closed)
        if a.action == "close":
            assert a.machine not in machines
            assert kind in ("dead", "declared"), a  # only a row whose owner is proven dead is closed
        if a.action != "delete":
            continue
        m = machines[a.machine]
        past = m.deadline + w.grace_s < NOW
        if kind in ("alive", "unknown"):
            # an owner alive or unknown: only the deadline or the machine's own stale stamp
            assert past or stale(w.beats.get(a.machine), 120.0), (a, kind, w.beats.get(a.machine))
    decided = {a.machine: a for a in actions}
    for name, m in machines.items():
        a = decided[name]
        kind = w.kinds[owner_of[name]]
        r = next((x for x in w.rows if x.name == name), None)
        if m.deadline + w.grace_s < NOW:
            assert (a.action, a.reason) == ("delete", "past its deadline")
        elif kind == "unknown" and not stale(w.beats.get(name), 120.0):
            # foreign: listed with its owner, its deadline and when the deadline rule takes it
            assert (a.action, a.reason, a.owner, a.deadline, a.expires) == (
                "keep", "foreign owner", name.split("-")[-2], m.deadline, m.deadline + w.grace_s)
            assert (name in ask) == (name not in w.beats)  # its host's stamp is what could prove it abandoned
        elif kind in ("dead", "declared") and (r is None or not r.resumable or r.state == "deleted"):
            assert a.action == "delete", a  # a proven dead owner's machine goes
        elif kind == "alive":
            assert (a.action, name in ask) == ("keep", False)  # a live owner's machine: no stamp is even read
    assert not [n for n in w.launched_during if n in decided and decided[n].action != "keep"]


def test_a_small_window_written_on_the_machine_does_not_lower_the_sweeps_floor() -> None:
    """Another ledger's sweep (a foreign owner) reads a stamp 5 s old with `lost_after` 1 written
    beside it (poll_s >= lost_after_s, as an older actor-run accepted): its controller may well be
    polling every 5 s. Below the sweep's own floor, that is no proof: the machine stays."""
    owner = "f" * 32
    m = Machine(cloud="sim", id="m", name=encode_name("j", 1, 0, owner, NOW + 3600), deadline=NOW + 3600)
    owners = Owners(alive=frozenset(), known=frozenset())
    young = decide(m, None, owners, now=NOW, grace_s=600, beat=HostBeat(age_s=5.0, lost_after_s=1.0))
    assert young is not None
    assert young.action == "keep"
    old = decide(m, None, owners, now=NOW, grace_s=600, beat=HostBeat(age_s=MIN_BEAT_WINDOW_S + 1, lost_after_s=1.0))
    assert old is not None
    assert old.action == "delete"
